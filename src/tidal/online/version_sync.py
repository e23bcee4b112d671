"""Policy versions through tidal's weight sync: publish a model as a version, load one back.

    learner / --checkpoint ── publish_model ── Publisher ──> RUN_DIR/weights (VersionStore)
    serving ── VersionLoader ── origin on loopback ── Puller (sha256 of every tensor) ── model

Every response names its version's ``weights_digest``: a sha256 over each tensor's (name, dtype,
shape, sha256), the same for a version's delta and anchor forms (both describe the same final
tensors). A loaded version whose digest differs from the one the registry recorded is refused
(``WeightsMismatch``): the server never serves weights under a name they do not have.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tidal.errors import UserError
from tidal.sync.config import SyncConfig
from tidal.sync.errors import SyncError
from tidal.sync.manifest import WeightManifest
from tidal.sync.origin import Publisher, ServerThread, VersionStore, make_app
from tidal.sync.pull import Puller
from tidal.sync.tensors import TensorBits, bits_of, cast_floats

CONFIG_FILE = "config.json"


class WeightsMismatch(UserError):
    """A version's weights are not what the registry says (or could not be verified at all)."""


def _digest(rows) -> str:
    """sha256 over sorted (name, dtype, shape, sha256) rows as canonical JSON."""
    body = json.dumps(sorted([n, d, list(s), h] for n, d, s, h in rows), separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def weights_digest(manifest: WeightManifest) -> str:
    """The digest a response names for this version (equal for its delta and anchor forms)."""
    return _digest((t.name, t.dtype, t.shape, t.digest) for t in manifest.tensors)


def tensors_digest(tensors: list[TensorBits], hash: str = "blake3") -> str:
    """The same digest computed from tensors' own bytes (hashes every tensor by ``hash``, the
    manifests' ``hash``: sync.hash)."""
    return _digest((t.name, t.dtype, t.shape, t.digest(hash)) for t in tensors)


def publish_model(model, store_root: str | Path, version: int, dtype: str,
                  cfg: SyncConfig | None = None, publisher: Publisher | None = None) -> str:
    """Publish ``model`` (cast to ``dtype``, the engines' dtype) as ``version`` into the store
    folder (a delta against the previous version, anchors per ``cfg``); returns its digest.
    ``publisher``: one kept by the caller (a learner), saving the rebuild of the newest version
    a fresh Publisher does on an existing store."""
    from tidal.model.checkpoint import config_to_hf, to_hf_state_dict

    tensors = cast_floats(to_hf_state_dict(model), dtype)
    config = json.dumps(config_to_hf(model.config, dtype)).encode()
    publisher = publisher or Publisher(store_root, cfg or SyncConfig())
    forms = publisher.publish([bits_of(k, v) for k, v in tensors.items()], {CONFIG_FILE: config},
                              version=version)
    return weights_digest(forms[0])


def publish_checkpoint(checkpoint_dir: str | Path, store_root: str | Path, version: int = 0,
                       dtype: str | None = None, cfg: SyncConfig | None = None) -> str:
    """Publish a Hugging Face checkpoint folder (in ``dtype``, default its own) as ``version``."""
    from tidal.model.checkpoint import from_pretrained

    model = from_pretrained(checkpoint_dir, dtype=dtype)
    dtype = dtype or str(next(model.parameters()).dtype).removeprefix("torch.")
    return publish_model(model, store_root, version, dtype, cfg)


def manifest_digest(store_root: str | Path, version: int) -> str:
    """The digest of a version as its own stored manifest states it (any form)."""
    store = VersionStore(store_root)
    for kind in ("anchor", "delta"):
        if store.has(version, kind):
            return weights_digest(store.manifest(version, kind))
    raise WeightsMismatch(f"version {version} is not in {store_root}")


class VersionLoader:
    """Loads versions of one store folder: an origin on loopback over it, and a fresh Puller per
    load (which checks every tensor's sha256 against the manifest), then the digest of what was
    pulled against the registry's. Thread-safe enough for one caller at a time."""

    def __init__(self, store_root: str | Path, cfg: SyncConfig | None = None):
        self.root = Path(store_root)
        self.cfg = cfg or SyncConfig(retries=1)
        self.server = ServerThread(make_app(VersionStore(self.root)))

    def load_tensors(self, version: int, expected_sha256: str) -> tuple[list[TensorBits], dict]:
        """The verified tensors and side files of ``version``; WeightsMismatch if the pull
        fails verification or the digest is not ``expected_sha256``."""
        puller = Puller([self.server.url], self.cfg)
        try:
            puller.pull(version)
        except SyncError as e:
            raise WeightsMismatch(f"version {version} failed verification while loading: {e}") from None
        finally:
            puller.close()
        got = weights_digest(puller.manifest)
        if got != expected_sha256:
            raise WeightsMismatch(f"version {version}: its weights' digest is {got} but the "
                                  f"registry records {expected_sha256}; refusing to serve it")
        return puller.tensors, dict(puller.files)

    def load(self, version: int, expected_sha256: str, dtype: str):
        """A model of ``version`` in ``dtype``, its digest checked (see ``load_tensors``)."""
        from tidal.model.checkpoint import config_from_hf, model_from_hf_tensors

        tensors, files = self.load_tensors(version, expected_sha256)
        cfg = config_from_hf(json.loads(files[CONFIG_FILE]))
        cfg = cfg.model_copy(update={"dtype": dtype})
        named = {t.name: t.to_torch() for t in tensors}
        return model_from_hf_tensors(cfg, cast_floats(named, dtype)).eval()

    def close(self) -> None:
        self.server.stop()
