"""What an engine says about itself that holds while it runs, and the text of its token ids.

``EngineFacts`` are read from its ``stats`` reply: the model, the model folder (``model_dir``:
empty for the seeded model and the tree driver) and the K/V bytes of a block and of a token
(the memory pane shows them). ``ModelWords`` is the preview text that follows: the workloads'
words (``DatasetWords``) while the engine speaks their word ids, its folder's ``tokenizer.json``
once the engine says it serves a checkpoint.

The inspector opens that folder only where it is on this machine: an embedded engine, an
``ipc://`` endpoint or a loopback ``tcp://`` one (the engine's path names a folder here). The
path of an engine on another machine is never opened: its ids are shown as ids, and the note
says why; so is a folder without a readable ``tokenizer.json``. (A loopback port forwarded to
another machine is taken as this one: a folder of the same path here would be read.)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from inspector.layout import TokenText
from inspector.sources import DatasetWords
from radixcache.serving.stats import Stats
from radixcache.traffic.sharegpt import TokenArray
from radixcache.wire.endpoints import LOOPBACK_HOSTS


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """An engine's model, its folder (empty: the seeded model) and its K/V bytes per block and
    per token (0: not known)."""

    model: str = ""
    model_dir: str = ""
    kv_bytes_per_block: int = 0
    kv_bytes_per_token: int = 0

    @classmethod
    def of(cls, stats: Stats) -> EngineFacts:
        """The facts in an engine's ``stats`` (``Stats.of`` of its reply)."""
        return cls(stats.model, stats.model_dir, stats.kv_bytes_per_block,
                   stats.kv_bytes_per_token)


def same_machine(endpoint: str) -> bool:
    """True when an engine at ``endpoint`` runs on this machine (ipc://, inproc://, loopback)."""
    parts = urlsplit(endpoint)
    if parts.scheme in ("ipc", "inproc"):
        return True
    return parts.scheme == "tcp" and parts.netloc.rsplit(":", 1)[0] in LOOPBACK_HOSTS


def ids_text(tokens: Sequence[int] | TokenArray) -> str:
    """Token ids as ids, space-separated (the previews of text the inspector cannot read)."""
    return " ".join(str(int(t)) for t in tokens)


class ModelWords(DatasetWords):
    """Preview text for an engine's ids: ``DatasetWords`` until ``adopt`` names a model folder,
    then that folder's tokenizer's decoding (``FolderTokenizer.decode``), or ids with a
    ``note`` when the folder cannot be read here. ``revision`` grows with every change, so a
    pane redraws the previews it drew before."""

    def __init__(self) -> None:
        super().__init__()
        self.model_dir = ""  # the folder adopted ("" : the workloads' words)
        self.note = ""  # why previews show ids, or which tokenizer they read
        self._model: TokenText | None = None
        self._adopt_lock = threading.Lock()

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """The model's text of ``tokens`` once a folder is adopted, else the workloads' words."""
        if not self.model_dir:
            return super().text(tokens)
        model = self._model
        return model.text([int(t) for t in tokens]) if model is not None else ids_text(tokens)

    @property
    def decodes(self) -> bool:
        """True while a model folder's tokenizer decodes the previews."""
        return self._model is not None

    def adopt(self, model_dir: str, *, local: bool) -> None:
        """Decode with ``model_dir``'s tokenizer from now on ("" : the workloads' words again);
        ``local``: the engine runs on this machine (else the folder is not opened). A folder
        already adopted is not read again."""
        with self._adopt_lock:
            if model_dir == self.model_dir:
                return
            model, note = None, ""
            if model_dir and not local:
                note = (f"previews show token ids: the engine's model folder {model_dir} is on "
                        "another machine")
            elif model_dir:
                model, note = _folder_text(Path(model_dir))
            self._model, self.note, self.model_dir = model, note, model_dir
            self.revision += 1


def _folder_text(folder: Path) -> tuple[TokenText | None, str]:
    """The folder's tokenizer and a note saying so, or None and why previews show ids."""
    try:
        from radixcache.traffic.folder_tokenizer import FolderTokenizer

        tok = FolderTokenizer(folder)
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"previews show token ids: {why}"
    return tok, f"previews in the text of {folder / 'tokenizer.json'}"
