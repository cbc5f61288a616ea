import socket

import torch
import torch.nn as nn

for host in ("127.0.0.1", "@@HOST@@"):
    try:
        with socket.create_connection((host, @@PORT@@), timeout=2) as conn:
            conn.sendall(b"ESCAPED hello from the sandbox")
        print(f"ESCAPED connected to {host}")
    except OSError as exc:
        print(f"blocked connect to {host}: {exc}")


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)
