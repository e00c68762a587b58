"""placeholder"""
def setup(app):
    return {}
