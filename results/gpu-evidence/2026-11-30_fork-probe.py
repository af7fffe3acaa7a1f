"""Probe: can a process that imported torch/deepspeed/transformers (CUDA untouched) fork children
that then use CUDA? Times the imports and each child's first CUDA work."""
import os, sys, time
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
t0 = time.time()
import torch
t1 = time.time()
import deepspeed
t2 = time.time()
import transformers
from transformers import LlamaForCausalLM
t3 = time.time()
import peft  # noqa
t4 = time.time()
print(f"import torch {t1-t0:.2f}s deepspeed {t2-t1:.2f}s transformers {t3-t2:.2f}s peft {t4-t3:.2f}s", flush=True)
print("cuda initialized in parent:", torch.cuda.is_initialized(), flush=True)
for i in range(2):
    ts = time.time()
    pid = os.fork()
    if pid == 0:
        try:
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
            y = (x @ x).float().sum().item()
            from deepspeed.ops.adam import FusedAdam  # noqa
            print(f"child {i}: cuda ok {y:.3g}, first CUDA work {time.time()-ts:.2f}s after fork", flush=True)
            os._exit(0)
        except BaseException as e:
            print(f"child {i}: FAILED {type(e).__name__}: {e}", flush=True)
            os._exit(3)
    _, st = os.waitpid(pid, 0)
    print(f"child {i} exit status {os.waitstatus_to_exitcode(st)}", flush=True)
