"""Why a model did not load, in one line: for the clients who asked for it (never a server path) and for the log.

mlx_lm.load takes a path that is not a folder here for a Hugging Face id and asks the Hub for it, so a newcomer's
commonest failure (an id, and no network) arrives as huggingface_hub's errors, at the end of a long traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub.errors import (
    GatedRepoError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tasks.catalogue import ModelConfig
from worker.unsupported import Unsupported


@dataclass(frozen=True)
class LoadFailure:
    """`reason`: what the model's jobs and /readyz say; `cause`: the log's one line, or None when the cause is not
    known here (the log then keeps the traceback)."""

    reason: str
    cause: str | None


def explain(exc: Exception, config: ModelConfig) -> LoadFailure:
    """Say why `config` failed to load with `exc`."""
    hub_id = config.path
    if isinstance(exc, Unsupported):  # (GGUF import, embedding and vision models: their messages say it all)
        return _known(str(exc))
    if isinstance(exc, LocalEntryNotFoundError | OfflineModeIsEnabled):
        return _known(
            f"{hub_id} is a Hugging Face id and its files are not in this machine's cache; this machine could not "
            f"download them (offline?): download it once with `hf download {hub_id}`, or name a local folder"
        )
    if isinstance(exc, GatedRepoError):  # (before its parent, RepositoryNotFoundError)
        return _known(
            f"Hugging Face gives {hub_id} only to those who accepted its terms: accept them on its page, log in "
            "with `hf auth login`, or name a local folder"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return _known(f"Hugging Face has no model {hub_id} (or it is private): check the id, or name a local folder")
    if isinstance(exc, RevisionNotFoundError):
        return _known(f"Hugging Face has no revision {config.revision} of {hub_id}")
    if isinstance(exc, HFValidationError):  # neither a folder nor an id: the path is the server's, not for clients
        what = "its path is neither a folder on this machine nor a Hugging Face id"
        return LoadFailure(f"the model failed to load: {what}", f"{config.path}: {what}")
    kind = "its files were not found" if isinstance(exc, OSError) else "it could not be loaded"
    return LoadFailure(f"the model failed to load ({kind}); the worker logged the error", None)


def _known(cause: str) -> LoadFailure:
    return LoadFailure(f"the model failed to load: {cause}", cause)
