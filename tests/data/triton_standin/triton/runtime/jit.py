class JITFunction:
    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise RuntimeError("0 active drivers ([]). There should only be one.")
        return launch


def jit(fn):
    return JITFunction(fn)
