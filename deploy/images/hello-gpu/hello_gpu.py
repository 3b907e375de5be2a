"""Hello GPU: the lab's guided first job.

Prints the GPUs the portal gave this job, their name and memory where nvidia-smi or
pynvml can tell, then does a few seconds of real work: on the GPU when CuPy or PyTorch
is installed, otherwise on the CPU (and it says so). Needs only python3; exits 0.

    python3 hello_gpu.py            # HELLO_GPU_SECONDS=3 by default
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

SECONDS = float(os.environ.get("HELLO_GPU_SECONDS", "3"))


def visible_devices() -> None:
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        value = os.environ.get(name)
        print(f"GPUs given to this job: {name}={value if value is not None else '(not set)'}")


def gpu_names() -> list[str]:
    """One line per GPU this job can see: 'index, name, memory', or [] when none can tell."""
    if shutil.which("nvidia-smi"):
        query = "--query-gpu=index,name,memory.total,uuid"
        done = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip():
            return [line.strip() for line in done.stdout.splitlines() if line.strip()]
        print(f"nvidia-smi answered {done.returncode}: {done.stderr.strip()}")
    try:
        import pynvml

        pynvml.nvmlInit()
        lines = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            lines.append(f"{index}, {name}, {memory} MiB")
        return lines
    except Exception:  # no pynvml, or no driver: nothing to tell
        return []


def gpu_work() -> bool:
    """A few seconds of matrix products on the first GPU; False when no GPU library is here."""
    try:
        import cupy

        a = cupy.random.random((2048, 2048), dtype=cupy.float32)
        sync = cupy.cuda.Device().synchronize
        multiply = lambda: a @ a  # noqa: E731
        library = "CuPy"
    except Exception:
        try:
            import torch

            if not torch.cuda.is_available():
                return False
            a = torch.rand((2048, 2048), device="cuda")
            sync = torch.cuda.synchronize
            multiply = lambda: a @ a  # noqa: E731
            library = "PyTorch"
        except Exception:
            return False
    count, start = 0, time.monotonic()
    while time.monotonic() - start < SECONDS:
        multiply()
        sync()
        count += 1
    elapsed = time.monotonic() - start
    tflops = count * 2 * 2048**3 / elapsed / 1e12
    print(f"GPU work ({library}): {count} products of 2048x2048 matrices, {tflops:.1f} TFLOP/s")
    return True


def cpu_work() -> None:
    """A few seconds of arithmetic on the CPU, with NumPy if it is installed."""
    count, start = 0, time.monotonic()
    try:
        import numpy

        a = numpy.random.random((512, 512))
        while time.monotonic() - start < SECONDS:
            a @ a
            count += 1
        what = f"{count} NumPy products of 512x512 matrices"
    except ImportError:
        total = 0
        while time.monotonic() - start < SECONDS:
            total += sum(i * i for i in range(10_000))
            count += 1
        what = f"{count} rounds of pure-Python sums"
    print(f"CPU work, not GPU work: {what} in {time.monotonic() - start:.1f} s")


def main() -> int:
    print("Hello GPU: the lab's first job")
    visible_devices()
    names = gpu_names()
    for line in names:
        print(f"GPU: {line}")
    if not names:
        print(
            "GPU: no nvidia-smi or pynvml here, so the GPU's name and memory are unknown "
            "(in the portal's demo the GPUs are simulated)"
        )
    if not (names and gpu_work()):
        if names:
            print("No CuPy or PyTorch in this image: the work below runs on the CPU.")
        cpu_work()
    print("Done: the job ends with exit code 0.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
