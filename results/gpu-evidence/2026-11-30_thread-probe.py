"""Probe (GPU host): which import starts threads or touches CUDA when deepspeed is imported the way
the fork server imports it? An import hook checks after every module; the first module after which
the native thread count (beyond numpy's OpenBLAS pool) rises is named, with the new threads' names."""
import importlib.abc, os, sys, time
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
import numpy  # noqa
def tids(): return set(os.listdir("/proc/self/task"))
def names(ts): return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in ts if os.path.exists(f"/proc/self/task/{t}/comm"))
base = tids()
seen = []
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        for f in sys.meta_path:
            if f is self: continue
            spec = getattr(f, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                orig = spec.loader.exec_module
                def exec_module(module, orig=orig, name=name):
                    orig(module)
                    now = tids()
                    new = now - base
                    tc = getattr(sys.modules.get("torch"), "cuda", None)
                    cuda = bool(getattr(tc, "is_initialized", lambda: False)()) if tc is not None else False
                    if (len(new) > len(seen[-1][1]) if seen else new) or (cuda and not any(c for _, _, c in seen)):
                        seen.append((name, new, cuda))
                        print(f"after {name}: {len(new)} extra threads {names(new)} cuda_initialized={cuda}", flush=True)
                spec.loader.exec_module = exec_module
                return spec
        return None
sys.meta_path.insert(0, Hook())
t = time.time()
import torch
import deepspeed
import transformers
from transformers.models.llama import modeling_llama  # noqa
print(f"done in {time.time()-t:.1f}s; extra threads {len(tids()-base)}: {names(tids()-base)}", flush=True)
for m in ("triton", "cupy"):
    print(m, "imported" if m in sys.modules else "not imported", flush=True)
