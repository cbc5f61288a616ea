import os
import sys

import torch
import torch.nn as nn

# Replace files of the scratch directory that the session reads after the run with what
# the session would read as its own user, outside the sandbox: a link to a file of the
# session's (its environment, the project's .env, a secret outside the view), a FIFO (the
# session's read would wait forever) or a device without end.
NAMES = @@NAMES@@
KIND = "@@KIND@@"
TARGET = "@@TARGET@@"
EXIT = @@EXIT@@  # leave without a result: the session reads whatever is at result.json

print("before-link")
sys.stdout.flush()
sys.stderr.write("before-link-err\n")
sys.stderr.flush()
for name in NAMES:
    if name == "result.json":
        name = sys.argv[sys.argv.index("--result") + 1]
    elif name == "progress.log":
        name = sys.argv[sys.argv.index("--progress") + 1]
    try:
        os.unlink(name)
    except OSError:
        pass
    try:
        if KIND == "symlink":
            os.symlink(TARGET, name)
        elif KIND == "fifo":
            os.mkfifo(name)
        elif KIND == "hardlink":
            os.link(TARGET, name)
        print(f"planted {KIND} at {os.path.basename(name)}")
    except OSError as exc:
        print(f"blocked {KIND} at {os.path.basename(name)}: {exc.strerror}")
print("after-link")
sys.stdout.flush()
if EXIT:
    os._exit(0)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        y = torch.addmm(self.lin.bias, x, self.lin.weight.t())
        y = y - y.max(dim=-1, keepdim=True).values
        e = y.exp()
        return e / e.sum(dim=-1, keepdim=True)
