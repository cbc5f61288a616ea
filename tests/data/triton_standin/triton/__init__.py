from .runtime.jit import jit
from .runtime.autotuner import autotune, Config
