"""What the SGLang rollout replaces, under which flag, and which SGLang versions it trusts.

One table shared by the plugin that runs inside SGLang (``dsv4kit.rollout.plugin``) and the status
report that only reads SGLang's files (``dsv4kit.rollout.status``), so the two can never disagree.
Standard library only: this module is imported inside every SGLang scheduler process.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
from dataclasses import dataclass
from typing import Optional

#: The SGLang releases whose call sites, argument layouts and hook registry the kernels were
#: checked against (docs/sglang-contract.md). Any other version stays stock.
SUPPORTED_SGLANG_VERSIONS = ("0.5.23",)

#: The entry-point group SGLang loads in every scheduler/worker process, and our entry there.
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "dsv4kit"
PLUGIN_VALUE = "dsv4kit.sglang_plugin:register"

INDEXER_FLAG = "SGLANG_SM120_TRITON_INDEXER"
ATTENTION_FLAG = "SGLANG_SM120_MMA_ATTENTION"
FLAGS = (INDEXER_FLAG, ATTENTION_FLAG)

# Parsed the way SGLang parses its own boolean variables (srt/environ.py, EnvBool).
_TRUE = ("true", "1", "yes", "y")
_FALSE = ("false", "0", "no", "n", "")

_INDEXER_PARAMETERS = ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table",
                       "deep_gemm_metadata", "max_seq_len", "clean_logits")


@dataclass(frozen=True)
class Target:
    """One SGLang module-level function the rollout may replace."""

    key: str  # short name used in logs, status and tests
    flag: str  # environment variable that turns the replacement on
    module: str  # dotted module that defines the function
    function: str  # the function's name in that module
    parameters: tuple  # its signature in canonical form (see canonical_parameters)
    kernel: str  # "module:attribute" of the dsv4kit kernel that replaces it
    requires: Optional[str] = None  # a top-level module that must import (else: not applicable)
    keep_attribute: Optional[str] = None  # a module constant callers read; must exist, is kept
    # Only the leading parameters must match (later ones need defaults); a compiled function
    # without an introspectable signature is read from its pybind docstring.
    leading_parameters: bool = False

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.function}"

    @property
    def kernel_module(self) -> str:
        return self.kernel.split(":", 1)[0]

    @property
    def kernel_attribute(self) -> str:
        return self.kernel.split(":", 1)[1]

    def source_file(self, sglang_dir: str) -> str:
        """Path of the defining file under the directory holding the ``sglang`` package."""
        relative = self.module.split(".")[1:]  # drop the leading "sglang"
        return os.path.join(sglang_dir, *relative) + ".py"


TARGETS = (
    # The torch sm_120 fallback: used when SGLANG_OPT_USE_TILELANG_INDEXER=0 (docs/sglang-contract.md §3.1, step 4).
    Target(
        key="indexer",
        flag=INDEXER_FLAG,
        module="sglang.srt.layers.attention.dsv4.indexer",
        function="fp8_paged_mqa_logits_torch_sm120",
        parameters=_INDEXER_PARAMETERS,
        kernel="dsv4kit.kernels.indexer:fp8_paged_mqa_logits_for_sglang",
    ),
    # The sm_120 default (docs/sglang-contract.md §3.1, step 2); its module imports tilelang at the top.
    Target(
        key="indexer_tilelang",
        flag=INDEXER_FLAG,
        module="sglang.kernels.ops.attention.dsa.tilelang_kernel",
        function="tilelang_fp8_paged_mqa_logits",
        parameters=_INDEXER_PARAMETERS,
        kernel="dsv4kit.kernels.indexer:fp8_paged_mqa_logits_for_sglang",
        requires="tilelang",
    ),
    # The FP4 index-K cache (--enable-deepseek-v4-fp4-indexer, docs/sglang-contract.md §2.10):
    # SGLang imports DeepGEMM's function from the package on every call. The same flag as the
    # FP8 indexer: the server flag decides which of the two entries SGLang calls.
    Target(
        key="indexer_fp4",
        flag=INDEXER_FLAG,
        module="deep_gemm",
        function="fp8_fp4_paged_mqa_logits",
        parameters=("q", "kv_cache", "weights", "context_lens", "block_table", "schedule_meta",
                    "max_context_len", "clean_logits"),
        kernel="dsv4kit.kernels.indexer_fp4:fp8_fp4_paged_mqa_logits_for_sglang",
        requires="deep_gemm",
        leading_parameters=True,
    ),
    # Sparse-MLA decode, keyword arguments only (docs/sglang-contract.md §4.7). The backend reads
    # SM120_DECODE_MAX_TOKENS from the same module to decide how to pad heads.
    Target(
        key="attention",
        flag=ATTENTION_FLAG,
        module="sglang.kernels.ops.attention.flash_mla_sm120",
        function="flash_mla_with_kvcache_sm120",
        parameters=("**kwargs",),
        kernel="dsv4kit.kernels.sparse_mla_decode:flash_mla_with_kvcache_sm120",
        keep_attribute="SM120_DECODE_MAX_TOKENS",
    ),
)

#: The keyword arguments SGLang 0.5.23 passes to flash_mla_with_kvcache_sm120 (docs/sglang-contract.md §4.2).
ATTENTION_KWARGS = ("q", "k_cache", "head_dim_v", "softmax_scale", "indices", "topk_length",
                    "attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length")


@dataclass(frozen=True)
class FlagValue:
    name: str
    raw: Optional[str]  # None when unset
    enabled: bool
    error: Optional[str]  # set when the value is not a boolean


def read_flag(name: str, environ=None) -> FlagValue:
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    value = (raw or "").strip().lower()
    if value in _TRUE:
        return FlagValue(name, raw, True, None)
    if value in _FALSE:
        return FlagValue(name, raw, False, None)
    return FlagValue(name, raw, False,
                     f"{name}={raw!r} is not a boolean (use 1 to turn it on, 0 or unset for off)")


def sglang_version() -> Optional[str]:
    """The installed SGLang distribution's version, from its metadata (imports nothing)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def version_supported(version: Optional[str]) -> bool:
    """Exact release match; a local label (``0.5.23+cu130``) is allowed, a post-release is not."""
    if not version:
        return False
    return version.split("+", 1)[0] in SUPPORTED_SGLANG_VERSIONS


def canonical_parameters(signature: inspect.Signature) -> tuple:
    """A signature as a tuple of names: ``/`` after positional-only ones, ``*name`` / ``*`` before
    keyword-only ones, ``**name`` last. Defaults and annotations do not matter."""
    out = []
    kinds = inspect.Parameter
    seen_star = False
    params = list(signature.parameters.values())
    for i, p in enumerate(params):
        if p.kind is kinds.VAR_POSITIONAL:
            out.append(f"*{p.name}")
            seen_star = True
        elif p.kind is kinds.KEYWORD_ONLY and not seen_star:
            out.append("*")
            seen_star = True
            out.append(p.name)
        elif p.kind is kinds.VAR_KEYWORD:
            out.append(f"**{p.name}")
        else:
            out.append(p.name)
        if p.kind is kinds.POSITIONAL_ONLY and (i + 1 == len(params)
                                                or params[i + 1].kind is not kinds.POSITIONAL_ONLY):
            out.append("/")
    return tuple(out)


def docstring_parameters(doc: Optional[str], function: str) -> Optional[tuple]:
    """Parameter names from a pybind11 docstring's first line, ``name(a: T, b: U = x) -> R``:
    ``(names, defaulted)``, or None when the line is not such a signature."""
    line = (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""
    if not line.startswith(function + "(") or ")" not in line:
        return None
    body, depth, parts, current = line[len(function) + 1:], 0, [], ""
    for char in body:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    names = tuple(p.split(":")[0].split("=")[0].strip() for p in parts if p.strip())
    defaulted = tuple("=" in p for p in parts if p.strip())
    return names, defaulted


def format_parameters(parameters) -> str:
    return "(" + ", ".join(parameters) + ")"
