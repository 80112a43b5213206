"""Kernel names → kernel classes, from one ordered regex table, and kernel-name normalisation.

The first pattern that matches a kernel name (case-insensitive ``re.search``) decides its class;
a name that matches nothing is ``"other"``. Order matters: NCCL and memory kernels first (their
names contain words such as ``Sum`` or ``copy`` that later rules would catch), then the
specific compute families (attention, optimizer, norm), then GEMM/convolution, then generic
element-wise kernels. Every class is one of :data:`bayesprism.schema.KERNEL_CLASSES`.

Choices worth knowing (each tested in ``tests/test_classify.py`` on names from real traces):

* cuDNN convolutions (``scudnn``, ``xmma`` implicit GEMM, winograd, ``dgrad``/``wgrad``/
  ``fprop`` engines and their offset/layout helper kernels) are ``gemm``: they are GEMM-bound
  and are planned like GEMMs.
* ``ncclKernel_Reduce`` (rooted reduce) is ``broadcast``: same rooted, pipelined chain cost.
* fbgemm's embedding kernels (``split_embedding_*``, including the backward with a fused
  Adagrad update) are ``other``: they are embedding lookups, not a separate optimizer step.
* ``multi_tensor_apply`` kernels are ``optimizer`` (PyTorch's fused/foreach optimizer steps).
* Old-style Triton names (``triton__0d1d2d``) carry no operator; they are ``other``.
"""

from __future__ import annotations

import re
from functools import lru_cache

from bayesprism.schema import KERNEL_CLASSES

#: The ordered classification table: (class, pattern). First match wins.
KERNEL_CLASS_RULES: tuple[tuple[str, str], ...] = (
    # NCCL collectives, both kernel naming schemes (ncclKernel_* before NCCL 2.19, ncclDevKernel_*).
    ("allreduce", r"nccl(dev)?kernel_allreduce"),
    ("allgather", r"nccl(dev)?kernel_allgather"),
    ("reducescatter", r"nccl(dev)?kernel_reducescatter"),
    ("alltoall", r"nccl(dev)?kernel_alltoall"),
    ("broadcast", r"nccl(dev)?kernel_(broadcast|reduce_|reduce\b)"),
    ("sendrecv", r"nccl(dev)?kernel_(sendrecv|send|recv)"),
    # Memory movement recorded by Kineto as gpu_memcpy / gpu_memset activities.
    ("memcpy", r"^(memcpy|memset)\b|\bmemcpy|\bmemset"),
    # Fused attention.
    ("attention", r"flash|fmha|_attn|attention|\bmha_|xformers|cutlass_sm\d+_?mha"),
    # Embedding kernels of fbgemm before the optimizer rule (their names mention adagrad).
    ("other", r"split_embedding|embedding_codegen|dense_embedding"),
    # Optimizer steps.
    ("optimizer", r"multi_tensor_apply|adam|adagrad|lamb_|fused_sgd|sgd_kernel|optimizer"),
    # Normalisation layers (PyTorch native, cuDNN batch norm, Apex/TE fused norms).
    (
        "norm",
        r"layer_?norm|batch_?norm|rms_?norm|group_?norm|instance_?norm|cudnn::bn_|\bbn_(fw|bw)"
        r"|gammabetabackward|rowwisemoments|welford",
    ),
    # Triton: pointwise / matmul templates carry their kind in the name.
    ("gemm", r"^triton_(tem_)?(fused_)?.*\bmm\b|^triton_.*_mm_"),
    ("elementwise", r"^triton_poi_"),
    # GEMM/GEMV (cuBLAS, cuBLASLt, CUTLASS, nvjet, xmma) and cuDNN convolutions.
    (
        "gemm",
        r"(?<!fb)gemm|gemv|cutlass|xmma|cublas|nvjet|splitkreduce|dot_kernel|reduce_1block_kernel"
        r"|scudnn|cudnn_(infer|train)|cask_cudnn|winograd|dgrad|wgrad|fprop"
        r"|conv(?!ert)|cudnn::ops::|reduce_wgrad|scalepackedtensor|epilogue::impl",
    ),
    # Element-wise / pointwise kernels, copies and concatenation, gathers/scatters by index.
    (
        "elementwise",
        r"elementwise|vectorized|unrolled|fillfunctor|catarraybatchedcopy|copy_kernel"
        r"|scal_kernel|where_kernel|clamp|masked_fill|_to_dense|nan_to_num|pointwise",
    ),
)

_COMPILED: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (cls, re.compile(pattern, re.IGNORECASE)) for cls, pattern in KERNEL_CLASS_RULES
)
if any(cls not in KERNEL_CLASSES for cls, _ in KERNEL_CLASS_RULES):  # pragma: no cover
    raise RuntimeError("KERNEL_CLASS_RULES names a class outside schema.KERNEL_CLASSES")

#: NCCL's "Collective name" argument (PyTorch profiler) → kernel class.
COLLECTIVE_NAME_CLASSES: dict[str, str] = {
    "allreduce": "allreduce",
    "all_reduce": "allreduce",
    "allreduce_coalesced": "allreduce",
    "allgather": "allgather",
    "all_gather": "allgather",
    "_allgather_base": "allgather",
    "allgather_into_tensor_coalesced": "allgather",
    "allgather_coalesced": "allgather",
    "reduce_scatter": "reducescatter",
    "reducescatter": "reducescatter",
    "_reduce_scatter_base": "reducescatter",
    "reduce_scatter_tensor_coalesced": "reducescatter",
    "all_to_all": "alltoall",
    "alltoall": "alltoall",
    "all_to_allv": "alltoall",
    "alltoall_base": "alltoall",
    "broadcast": "broadcast",
    "reduce": "broadcast",
    "send": "sendrecv",
    "recv": "sendrecv",
    "recv_anysource": "sendrecv",
    "sendrecv": "sendrecv",
    "gather": "allgather",
    "scatter": "broadcast",
}

_NCCL = re.compile(r"^nccl(dev)?kernel", re.IGNORECASE)


@lru_cache(maxsize=65536)
def classify_kernel(name: str) -> str:
    """Kernel class of one kernel name (first matching rule of :data:`KERNEL_CLASS_RULES`).

    Parameters
    ----------
    name
        Raw or normalised kernel name as written by the profiler.

    Returns
    -------
    str
        One of :data:`bayesprism.schema.KERNEL_CLASSES` (``"other"`` when nothing matches).
    """
    for cls, pattern in _COMPILED:
        if pattern.search(name):
            return cls
    return "other"


def collective_class(collective_name: str | None) -> str | None:
    """Class of a collective from the profiler's ``"Collective name"`` argument, if known."""
    if not collective_name:
        return None
    return COLLECTIVE_NAME_CLASSES.get(str(collective_name).strip().lower())


def is_nccl_kernel(name: str) -> bool:
    """True for NCCL device kernels (``ncclKernel_*`` and ``ncclDevKernel_*``)."""
    return bool(_NCCL.match(name))


@lru_cache(maxsize=65536)
def normalize_kernel_name(name: str) -> str:
    """A recognisable, stable kernel name.

    Removes the leading ``void`` return type and the trailing C++ parameter list (which repeats
    the template arguments and differs between NCCL versions, e.g. ``(ncclWorkElem)`` vs
    ``(ncclDevComm*, unsigned long, ncclWork*)``), and collapses white space. Template
    arguments are kept: they distinguish real variants (tile shapes, dtypes, functors).
    """
    text = " ".join(name.split())
    if text.startswith(("Memcpy", "Memset")):
        return text  # "Memcpy HtoD (Pageable -> Device)": the parenthesis is the direction
    if text.startswith("void "):
        text = text[5:]
    if text.endswith(")"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            ch = text[i]
            if ch == ")":
                depth += 1
            elif ch == "(":
                depth -= 1
                if depth == 0:
                    text = text[:i].rstrip() or text
                    break
    return text
