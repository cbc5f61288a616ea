import subprocess
import sys

import torch
import torch.nn as nn

# A grandchild in its own session (and process group) that outlives the worker and keeps
# touching a file outside the sandbox... or tries to.
code = (
    "import os, time\n"
    "os.setsid()\n"
    "for i in range(600):\n"
    "    try:\n"
    "        open('@@MARKER@@', 'a').write('ESCAPED alive %d\\n' % i)\n"
    "    except OSError:\n"
    "        pass\n"
    "    time.sleep(0.1)\n"
)
child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
print(f"started pid {child.pid} in its own session")
with open("@@PIDFILE@@", "w") as handle:  # outside the scratch directory: must fail
    handle.write(str(child.pid))


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
