class Config:
    def __init__(self, kwargs):
        self.kwargs = kwargs


class Autotuner:
    def __init__(self, fn, configs, key):
        self.fn, self.configs, self.key = fn, configs, key

    def __getitem__(self, grid):
        return self.fn[grid]


def autotune(configs, key):
    return lambda fn: Autotuner(fn, configs, key)
