"""The tiny causal LM, its streamed training windows, the fitted leaf, and a char tokenizer."""

from .leaf import StreamingTransformerLeaf, StreamingTransformerLeafEstimator
from .model import CausalLM, build_causal_lm
from .source import stream_sequence_source, stream_token_source
from .text import CharTokenizer, stdlib_text

__all__ = [
    "build_causal_lm",
    "CausalLM",
    "stream_sequence_source",
    "stream_token_source",
    "StreamingTransformerLeaf",
    "StreamingTransformerLeafEstimator",
    "CharTokenizer",
    "stdlib_text",
]
