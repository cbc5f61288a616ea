import os
from pathlib import Path

# What torch's build lock (FileBaton) looks like when a load_inline build dies mid-way.
lock = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "kp_fake_extension" / "lock"
lock.parent.mkdir(parents=True, exist_ok=True)
lock.write_text("")
os._exit(1)  # the worker dies while building
