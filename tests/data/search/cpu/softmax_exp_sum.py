"""A correct candidate for `softmax_rows.py` that is not bit-identical to the reference:
every comparison of its outputs runs the rule's passes."""

from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        m = x.amax(dim=1, keepdim=True)
        e = (x - m).exp_()
        return e.div_(e.sum(dim=1, keepdim=True))
