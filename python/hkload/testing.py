"""Test helpers: a simulated GPU of any target ID, through hkload's recording driver.

It chooses code objects, loads modules and checks every call exactly as a real GPU does, then
records the launch instead of running it. Its memory is host memory: numpy arrays (any CPU
DLPack array) pass as its buffers, and ``Device.launches()`` shows the packed arguments.

>>> import numpy as np, hkload, hkload.testing
>>> device = hkload.testing.simulated_device("sm_90")
>>> kernels = hkload.Bundle("dist/hk-kernels-0.1.0").load(device)
>>> x = np.zeros(8, dtype=np.float32); out = np.empty_like(x)
>>> kernels.relu_f32(out, x, 8)
>>> device.launches()[-1]["kernel"]
'relu_f32'
"""

from ._native import simulated_device

__all__ = ["simulated_device"]
