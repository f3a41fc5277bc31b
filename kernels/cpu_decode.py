"""The native CPU step (cpu_decode.c): built on first use with the system's C compiler,
cached on disk, called through ctypes.

Never for the build machine's own CPU (-march=native): the machines a cache or an image moves
between differ (one lists AMX and refuses it, another has no AVX-512), so the choice is made at
run time. Two builds, tried in order: "avx2" (AVX2, FMA, F16C: the vector products and attention
of cpu_decode_vector.h) and "baseline" (the compiler's default x86-64 or other target). A build
is used only after its probe ran in a forked child and matched; the packed matrices' kernels
(AVX-512 VNNI, AVX2, portable) are chosen the same way inside whichever build loaded.
SPECDEC_NATIVE_BUILD names one build. Each is cached under a name that hashes the source, its
flags and the compiler. It links the OpenMP runtime PyTorch has already loaded (libgomp.so.1), so
its parallel regions use torch's threads and thread count. Where no compiler is found, or no
build loads, `library()` says why and callers stay eager.
"""

import ctypes
import faulthandler
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401  (loads the OpenMP runtime the library shares)

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_decode.c")
HEADERS = [Path(__file__).with_name(name)  # included by SOURCE
           for name in ("cpu_decode_vector.h", "cpu_decode_avx512.h", "cpu_decode_experts.h", "cpu_prefill_attention.h",
                        "cpu_quant.h", "cpu_quant_vnni.h")]
FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC"]
BUILDS = {"avx2": ["-mavx2", "-mfma", "-mf16c"], "baseline": []}  # widest first
# glibc's vector math (libmvec) for the exponentials of the portable attention loop (the AVX2
# passes use their own inline exp); a C library without it builds with scalar expf instead.
VECTOR_MATH, NO_VECTOR_MATH = ["-lmvec"], ["-DSPECDEC_NO_MVEC"]
ABI_VERSION = 10
MAX_EXPERTS, MAX_TOP_K = 256, 64  # the C step's fixed routing buffers


class QMat(ctypes.Structure):
    """A matrix packed in 8-bit blocks of 32 columns, in tiles of 16 rows (cpu_quant.h)."""

    _fields_ = [("q", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("offset", ctypes.c_void_p),
                ("zero", ctypes.c_int64), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64), ("qmax", ctypes.c_int64)]


class Mat(ctypes.Structure):
    """A matrix where it lies: y[r] = sum_c w[r * s_row + c * s_col] x[c]; or packed (quant)."""

    _fields_ = [("w", ctypes.c_void_p), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
                ("s_row", ctypes.c_int64), ("s_col", ctypes.c_int64), ("half", ctypes.c_void_p),
                ("quant", ctypes.POINTER(QMat))]

    @classmethod
    def packed(cls, quant: QMat) -> "Mat":
        return cls(None, quant.rows, quant.cols, quant.cols, 1, None, ctypes.pointer(quant))

    @classmethod
    def of(cls, tensor: torch.Tensor, half: torch.Tensor | None = None) -> "Mat":
        """A 2-D fp32 view with unit stride along one of its dimensions, and optionally the same
        values in bf16 at the same strides (which the products then read)."""
        if tensor.dim() != 2 or tensor.dtype != torch.float32 or 1 not in tensor.stride():
            raise ValueError(f"not a matrix the native step reads: {tuple(tensor.shape)} {tensor.dtype} "
                             f"strides {tensor.stride()}")
        if half is not None and (half.dtype != torch.bfloat16 or half.shape != tensor.shape
                                 or half.stride() != tensor.stride()):
            raise ValueError("a bf16 copy must have the matrix's shape and strides")
        return cls(tensor.data_ptr(), *tensor.shape, *tensor.stride(), None if half is None else half.data_ptr())


class Layer(ctypes.Structure):
    _fields_ = [("attn_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("qkv", Mat),
                ("qkv_bias", ctypes.c_void_p), ("qk_norm", ctypes.c_void_p), ("o", Mat), ("o_bias", ctypes.c_void_p),
                ("num_experts", ctypes.c_int64), ("router", Mat), ("router_bias", ctypes.c_void_p),
                ("gate", Mat), ("up", Mat), ("down", Mat),
                ("gate_up_expert_stride", ctypes.c_int64), ("down_expert_stride", ctypes.c_int64)]


class Model(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_int64), ("num_layers", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("kv_heads", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("vocab", ctypes.c_int64),
                ("intermediate", ctypes.c_int64), ("top_k", ctypes.c_int64), ("renormalize", ctypes.c_int64),
                ("eps", ctypes.c_float), ("attn_scale", ctypes.c_float), ("rope_factor", ctypes.c_float),
                ("embed", ctypes.c_void_p), ("embed_quant", ctypes.POINTER(QMat)), ("final_norm", ctypes.c_void_p), ("lm_head", Mat),
                ("inv_freq", ctypes.c_void_p), ("layers", ctypes.POINTER(Layer)), ("capture", ctypes.c_void_p),
                ("capture_count", ctypes.c_int64)]


class Seq(ctypes.Structure):
    """One sequence's part of a step: its cache, committed length, new tokens and tree mask."""

    _fields_ = [("keys", ctypes.c_void_p), ("values", ctypes.c_void_p), ("capacity", ctypes.c_int64),
                ("length", ctypes.c_int64), ("n", ctypes.c_int64), ("mask", ctypes.c_void_p)]


def pointer(tensor: torch.Tensor | None) -> int | None:
    """A contiguous fp32 vector's address (None stays NULL)."""
    if tensor is None:
        return None
    if tensor.dtype != torch.float32 or not tensor.is_contiguous():
        raise ValueError(f"not a vector the native step reads: {tuple(tensor.shape)} {tensor.dtype}")
    return tensor.data_ptr()


def cache_dir() -> Path:
    configured = os.environ.get("SPECDEC_NATIVE_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec" / "native"


def _build(compiler: str, build: str) -> Path:
    flags = FLAGS + BUILDS[build]
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    sources = [path.read_text() for path in (SOURCE, *HEADERS)]
    key = hashlib.sha256("\n".join([*sources, " ".join(flags), version]).encode()).hexdigest()
    target = cache_dir() / f"cpu_decode-{build}-{key[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        for extra in (VECTOR_MATH, NO_VECTOR_MATH):
            done = subprocess.run([compiler, *flags, str(SOURCE), "-o", str(built), "-lm", *extra],
                                  capture_output=True, text=True)
            if done.returncode == 0:
                break
        if done.returncode:
            raise RuntimeError(f"{compiler} failed for the {build} build: {done.stderr[-1500:]}")
        os.replace(built, target)  # atomic: a concurrent build lands the same bytes
    return target


def _runs_in_child(call) -> bool:
    """Whether call() returns 0 in a forked child: an instruction this CPU (or its hypervisor)
    refuses kills the child, not this process."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            faulthandler.disable()  # a refused instruction is an answer here, not a crash to report
            status = call()
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _load(compiler: str) -> tuple[ctypes.CDLL, str]:
    """The widest build this CPU runs, and its name."""
    wanted = os.environ.get("SPECDEC_NATIVE_BUILD")
    if wanted and wanted not in BUILDS:
        raise RuntimeError(f"SPECDEC_NATIVE_BUILD={wanted}: expected one of {', '.join(BUILDS)}")
    refused = []
    for build in BUILDS:
        if wanted and build != wanted:
            continue
        try:
            lib = ctypes.CDLL(str(_build(compiler, build)))
        except (OSError, RuntimeError) as error:
            refused.append(f"{build}: {error}")
            continue
        if lib.specdec_abi_version() != ABI_VERSION:
            raise RuntimeError("stale build of cpu_decode.c")
        lib.specdec_build_probe.restype = ctypes.c_int
        if build == "baseline" or _runs_in_child(lib.specdec_build_probe):
            return lib, build
        refused.append(f"{build}: its probe failed on this CPU")
    raise RuntimeError("no build of cpu_decode.c runs here (" + "; ".join(refused) + ")")


_LIBRARY: list = []  # [ctypes.CDLL or None], filled once
_WHY_NOT: list = []
# The packed matrices' kernels, fastest first (codes of cpu_quant.h); the first one whose probe
# passes in a child process is used. SPECDEC_QKERNEL names one (the tests compare them).
QKERNELS = {"avx512_vnni": 2, "avx2": 1, "portable": 0}
_QKERNEL: list = []
_BUILD: list = []


def _probe_in_child(lib, code: int) -> bool:
    """Whether kernel `code` runs and matches the portable one, tried in a forked child."""
    return _runs_in_child(lambda: lib.specdec_qkernel_probe(code))


def _choose_qkernel(lib) -> str:
    wanted = os.environ.get("SPECDEC_QKERNEL")
    if wanted and wanted not in QKERNELS:
        raise RuntimeError(f"SPECDEC_QKERNEL={wanted}: expected one of {', '.join(QKERNELS)}")
    for name, code in QKERNELS.items():
        if wanted and name != wanted:
            continue
        if code == 0 or _probe_in_child(lib, code):
            lib.specdec_set_qkernel(code)
            return name
        log.info("packed-matrix kernel %s refused by this CPU (probe failed)", name)
    lib.specdec_set_qkernel(0)
    return "portable"


def qkernel() -> str | None:
    """The packed matrices' kernel in use ("avx512_vnni", "avx2" or "portable"), or None
    without the library."""
    return _QKERNEL[0] if _QKERNEL else None


def build() -> str | None:
    """The build in use ("avx2" or "baseline"), or None without the library."""
    return _BUILD[0] if _BUILD else None


def library() -> ctypes.CDLL | None:
    """The built library, or None (why_not() says why); built once per process."""
    if _LIBRARY:
        return _LIBRARY[0]
    lib = None
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    try:
        if compiler is None:
            raise RuntimeError("no C compiler (gcc or cc) on PATH")
        lib, name = _load(compiler)
        _BUILD.append(name)
        lib.specdec_reads_bf16.restype = ctypes.c_int64
        lib.specdec_forward.restype = ctypes.c_int
        lib.specdec_forward.argtypes = [ctypes.POINTER(Model), ctypes.c_int64, ctypes.POINTER(Seq), ctypes.c_int64,
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        lib.specdec_qkernel_probe.restype = ctypes.c_int
        lib.specdec_qkernel_probe.argtypes = [ctypes.c_int]
        lib.specdec_set_qkernel.argtypes = [ctypes.c_int]
        lib.specdec_qgemm.restype = ctypes.c_int
        lib.specdec_qgemm.argtypes = [ctypes.POINTER(QMat), ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                      ctypes.c_int, ctypes.c_int]
        _QKERNEL.append(_choose_qkernel(lib))
        lib.specdec_causal_attention.restype = ctypes.c_int
        lib.specdec_causal_attention.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                                 ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                                 ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                                 ctypes.c_float, ctypes.c_int]
    except (OSError, RuntimeError) as error:
        _WHY_NOT.append(str(error))
        log.warning("native CPU step unavailable, decoding eagerly: %s", error)
        lib = None
    _LIBRARY.append(lib)
    return lib


def why_not() -> str | None:
    return _WHY_NOT[0] if _WHY_NOT else None
