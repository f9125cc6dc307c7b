"""Tiny stand-ins for libraries that published projects import and the test machine does not install.

Each is written by a test into the project's own package folder (a Truss's ``packages/``, a Cortex project's
folder), where the published code imports it unchanged; none is a published file.
"""

from __future__ import annotations

from pathlib import Path

#: torch, as far as truss-examples' `multiprocessing` and Cortex's pytorch server-side-batching example use it:
#: tensors over numpy, nn.Module / Linear / Softmax, functional.relu, load (a pickle) and argmax.
TORCH = {
    "torch/__init__.py": """
import pickle

import numpy as np

from torch import autograd, nn  # noqa: F401


class Tensor:
    def __init__(self, array):
        self.array = np.asarray(array, dtype=np.float32)

    def to(self, device):
        return self

    def sum(self):
        return Tensor(self.array.sum())

    def numpy(self, force=False):
        return self.array

    def __getitem__(self, index):
        return Tensor(self.array[index])

    def __index__(self):
        return int(self.array)


def from_numpy(array):
    return Tensor(array)


def FloatTensor(data):
    return Tensor(data)


def matmul(a, b):
    return Tensor(a.array @ b.array)


def argmax(tensor):
    return Tensor(np.argmax(tensor.array))


def randn(*shape):
    return Tensor(np.random.randn(*shape))


def load(path):
    with open(path, "rb") as file:
        return pickle.load(file)
""",
    "torch/autograd.py": "def Variable(tensor):\n    return tensor\n",
    "torch/nn/__init__.py": """
import numpy as np

from torch.nn import functional  # noqa: F401


class Module:
    def __call__(self, *args):
        return self.forward(*args)

    def load_state_dict(self, state):
        for key, value in state.items():
            owner, _, name = key.rpartition(".")
            setattr(getattr(self, owner), name, np.asarray(value, dtype=np.float32))

    def eval(self):
        return self


class Linear(Module):
    def __init__(self, inputs, outputs):
        self.weight = np.zeros((outputs, inputs), dtype=np.float32)
        self.bias = np.zeros(outputs, dtype=np.float32)

    def forward(self, x):
        import torch

        return torch.Tensor(x.array @ self.weight.T + self.bias)


class Softmax(Module):
    def __init__(self, dim):
        self.dim = dim

    def forward(self, x):
        import torch

        shifted = np.exp(x.array - x.array.max(axis=self.dim, keepdims=True))
        return torch.Tensor(shifted / shifted.sum(axis=self.dim, keepdims=True))
""",
    "torch/nn/functional.py": """
import numpy as np


def relu(x):
    import torch

    return torch.Tensor(np.maximum(x.array, 0))
""",
}

#: boto3 and botocore, as Cortex's examples download their models: ``boto3.client("s3").download_file(bucket,
#: key, path)`` copies ``$STAND_IN_S3/<bucket>/<key>`` (a folder the test fills) to `path`.
BOTO3 = {
    "boto3/__init__.py": """
import os
import shutil


class _S3:
    def download_file(self, bucket, key, path):
        shutil.copyfile(os.path.join(os.environ["STAND_IN_S3"], bucket, key), path)


def client(service, config=None, **kwargs):
    assert service == "s3"
    return _S3()
""",
    "botocore/__init__.py": "UNSIGNED = object()\n",
    "botocore/client.py": "class Config:\n    def __init__(self, **kwargs):\n        self.options = kwargs\n",
}


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"), encoding="utf-8")
