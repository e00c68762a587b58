"""torch's private APIs the handles and the cluster use (mixle_nb/parallel/torch_internals.py):
on a torch version where one is gone, this fails first and names it, rather than a fault path
failing obscurely in the field."""

from pathlib import Path

import torch

from mixle_nb.parallel import torch_internals


def test_every_private_torch_api_used_is_there():
    missing = torch_internals.missing_private_apis()
    assert not missing, (
        f"torch {torch.__version__} lacks the private APIs {missing}, which "
        "mixle_nb/parallel/torch_internals.py uses (checked against torch "
        f"{torch_internals.CHECKED_TORCH}): find their replacement there, check it, and widen the pin"
    )


def test_the_torch_in_use_is_one_the_private_apis_were_checked_against():
    low, high = torch_internals.CHECKED_TORCH
    assert low <= torch_internals.torch_version() < high, (
        f"torch {torch.__version__} is outside {low} to {high} (exclusive), the versions whose private "
        "APIs mixle_nb/parallel/torch_internals.py was checked against: run this file's first test, then widen the pin"
    )


def test_the_pin_in_pyproject_is_the_checked_range():
    (low_major, low_minor), (high_major, high_minor) = torch_internals.CHECKED_TORCH
    pin = f'"torch>={low_major}.{low_minor},<{high_major}.{high_minor}"'
    assert pin in (Path(__file__).parents[1] / "pyproject.toml").read_text()


def test_a_missing_private_api_is_named(monkeypatch):
    import torch.distributed as dist

    monkeypatch.delattr(dist.distributed_c10d, "_get_default_store")
    monkeypatch.delattr(dist.ProcessGroup, "_get_sequence_number_for_group")
    assert torch_internals.missing_private_apis() == [
        "torch.distributed.distributed_c10d._get_default_store",
        "torch.distributed.ProcessGroup._get_sequence_number_for_group",
    ]


def test_only_torch_internals_reaches_into_torch_privately():
    root = Path(__file__).parents[1]
    private = ("distributed_c10d._", "._get_sequence_number", "reducer._", "torch._C")
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in list((root / "mixle_nb").rglob("*.py")) + list((root / "tests").glob("*.py"))
        if path.name not in ("torch_internals.py", "test_torch_internals.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if any(p in line for p in private)
    ]
    assert not offenders, f"torch private APIs outside mixle_nb/parallel/torch_internals.py: {offenders}"
