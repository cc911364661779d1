"""epcomm: expert-parallel dispatch and combine for Mixture-of-Experts models.

`epcomm.Buffer` takes the place of `deep_ep.Buffer`: the same constructor,
methods, arguments and return shapes (docs/python.md lists every difference).
Tensors cross into the C++ engine as DLPack, so the extension does not link
libtorch and survives torch upgrades. torch is imported when a Buffer is
first used, not by `import epcomm`.
"""

from ._epcomm import Error, __version__

__all__ = ["Buffer", "Config", "Error", "EventOverlap", "topk_idx_t", "__version__"]


def __getattr__(name):
    # These need torch; keep `import epcomm` free of it.
    if name in ("Buffer", "Config", "EventOverlap"):
        from . import buffer
        return getattr(buffer, name)
    if name == "topk_idx_t":  # DeepEP's dtype of topk_idx
        import torch
        return torch.int64
    raise AttributeError(f"module 'epcomm' has no attribute {name!r}")
