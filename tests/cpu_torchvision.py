"""torchvision in the CPU-only environment (`make test-cpu`, requirements/cpu.txt).

The package index has torchvision only as CUDA wheels. Against the CPU-only torch its compiled ops
(torchvision/_C.so) cannot load, and its import then fails where it registers fake kernels for two of
them (``torchvision::nms``, ``::qnms``). Its transforms, which the tests compare with, are Python over
torch ops. ``python tests/cpu_torchvision.py install`` copies this file into the environment's
site-packages with a .pth line that imports it in every process there (the tests and the processes they
start, such as Lightning's, which imports torchvision when installed); it then declares the two ops'
schemas just before torchvision is first imported, so that the import succeeds (the ops stay unusable).
A torch built with CUDA is left alone: its torchvision loads its own ops.
"""

import importlib.abc
import os
import shutil
import sys
import sysconfig

MODULE = "fastpipe_cpu_torchvision"


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            import torch

            if torch.version.cuda is None:
                lib = torch.library.Library("torchvision", "FRAGMENT")
                lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
                lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
                _BeforeTorchvision.library = lib  # the definitions live as long as it does
        return None


def install():
    site = sysconfig.get_paths()["purelib"]
    shutil.copyfile(os.path.abspath(__file__), os.path.join(site, MODULE + ".py"))
    with open(os.path.join(site, MODULE + ".pth"), "w") as f:
        f.write(f"import {MODULE}\n")
    print(f"cpu_torchvision: installed in {site}")


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python tests/cpu_torchvision.py install")
    install()
elif __name__ == MODULE:
    sys.meta_path.insert(0, _BeforeTorchvision())
