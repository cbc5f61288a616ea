import os

import torch
import torch.nn as nn

# Plant modules where a later candidate would load them: the build cache (built ahead by
# the search, read by every worker) and the torch extensions directory the session names.
targets = [
    os.path.join(os.environ.get("KERNELPRO_BUILD_CACHE", "/nonexistent"), "ab", "planted", "x.so"),
    os.path.join(os.environ.get("KERNELPRO_BUILD_CACHE", "/nonexistent"), "planted.txt"),
    "@@EXTENSIONS@@/kp_ext_shared/kp_ext_shared.so",
]
for path in targets:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(b"ESCAPED planted")
        print(f"ESCAPED planted {path}")
    except OSError as exc:
        print(f"blocked plant {path}: {exc.strerror}")


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
