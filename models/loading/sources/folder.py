"""Our checkpoint folders (``models.save``, ``python -m models.train``): ``config.json`` defines the
model and its task; ``model.safetensors`` holds the weights (``models.loading.checkpoint``)."""

from __future__ import annotations

from models.loading import checkpoint
from models.loading.sources.files import TASK_JSON, Found, Source, no_file_options
from models.loading.sources.task_json import read_task

NAME = "checkpoint folder"


def detect(found: Found) -> bool:
    """Anything that is neither a weight file nor a folder with a task.json: our folder (or a path that
    is not there, which ``read`` names with what is expected)."""
    return not found.path.is_file() and not (found.path.is_dir() and (found.path / TASK_JSON).is_file())


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    no_file_options(found, "one of our checkpoint folders: its config.json defines it")
    config = checkpoint.read_config(found.path, found.json)
    task, layout = read_task(
        config["task"], str(found.path / checkpoint.CONFIG), kinds=("markov_tree", "graph", "continuous")
    )
    if not weights:
        return Source(None, task, layout, found.where, "", NAME)
    model = checkpoint.load_checkpoint(found.path, device, config)
    return Source(model, task, layout, found.where, checkpoint.checkpoint_hash(found.path, found.bytes), NAME)
