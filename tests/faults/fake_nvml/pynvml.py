"""A stand-in for nvidia-ml-py that fails the way a broken NVML does (the fault suite puts this folder
first on PYTHONPATH): FAKE_NVML_FAIL=import (the binding cannot load its library), init (no driver:
NVMLError_LibraryNotFound, what nvidia-ml-py raises on a host without libnvidia-ml), count (NVML
starts but cannot enumerate the GPUs, as after a driver/library mismatch or a lost GPU)."""

import os

_FAIL = os.environ.get("FAKE_NVML_FAIL", "init")

if _FAIL == "import":
    raise OSError("libnvidia-ml.so.1: cannot open shared object file: No such file or directory")


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - nvidia-ml-py's name
    pass


class NVMLError_Unknown(NVMLError):  # noqa: N801
    pass


def nvmlInit():
    if _FAIL == "init":
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    raise NVMLError_Unknown("Unknown Error")


def nvmlDeviceGetHandleByIndex(i):
    raise NVMLError_Unknown("Unknown Error")


def nvmlSystemGetDriverVersion():
    raise NVMLError_Unknown("Unknown Error")
