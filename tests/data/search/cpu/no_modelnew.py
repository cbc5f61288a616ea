import torch.nn as nn


class Model(nn.Module):  # wrong class name
    def forward(self, x):
        return x
