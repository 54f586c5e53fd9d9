"""A whole pickled model, ``torch.save(model)`` of an ``nn.Module``: refused, with the line that says
what to save instead. Reading it back would import its class and run its code, so it is recognised from
the pickle's opcodes (``pickletools``, nothing executed): a class and the ``_parameters`` / ``_modules``
attributes every ``nn.Module`` pickles."""

from __future__ import annotations

import pickletools
import zipfile

from models.loading.sources.files import Found, Source, is_torch_file
from models.plumbing.io import UsageError

NAME = "pickled nn.Module"
MODULE_ATTRIBUTES = {"_parameters", "_buffers", "_modules"}
PLUMBING = ("torch", "collections", "builtins", "__builtin__", "copyreg", "_codecs")  # tensors, dicts


def pickled_class(path) -> str | None:
    """The class of the ``nn.Module`` pickled in the torch zip archive ``path`` (``module.Name``), or None
    when the archive holds no pickled module (a state dict, a nanoGPT dict, a legacy file...)."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            data = archive.read(name) if name is not None else b""
    except (zipfile.BadZipFile, OSError):
        return None
    strings, classes, recent = set(), [], []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                classes.append(arg.replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(recent) == 2:
                classes.append(".".join(recent))
            if isinstance(arg, str):
                strings.add(arg)
                recent = [*recent[-1:], arg]
    except Exception:  # not a pickle pickletools can walk: the other formats say what it is
        return None
    own = [c for c in classes if c.startswith("torch.nn.") or not c.startswith(PLUMBING)]
    if not MODULE_ATTRIBUTES <= strings or not own:
        return None
    return own[0]


def detect(found: Found) -> bool:
    return is_torch_file(found.path) and pickled_class(found.path) is not None


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    stem = found.path.stem
    raise UsageError(
        f"{found.path} is a whole pickled model (torch.save(model) of {pickled_class(found.path)}); loading it "
        f"would run its code, so it is refused. Save its weights instead: torch.save(model.state_dict(), "
        f"'{stem}.pt') with its config beside it (a TransformerLens HookedTransformer: json.dump(model.cfg.to_dict(), "
        f"open('{stem}.json', 'w'), default=str); ours: models.save(model, folder, task=task)) and a task.json"
    )
