"""Probe (GPU host): with the threads that importing DeepSpeed leaves behind there (scipy's OpenBLAS
pool, pyarrow's jemalloc thread, one driver thread), can a forked child still use CUDA, NCCL and a
fused optimizer? Imports what the fork server preloads, attributes each thread to its cause by
importing the suspected owners first, then forks two children that train a step."""
import os, sys, time
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
def tids(): return set(os.listdir("/proc/self/task"))
def names(ts): return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in ts if os.path.exists(f"/proc/self/task/{t}/comm"))
t0 = time.time(); base = tids(); prev = base
for step in ("numpy", "scipy.linalg", "pyarrow", "nvml", "torch", "deepspeed", "transformers.models.llama.modeling_llama",
             "bench.worker.train"):
    try:
        if step == "nvml":
            import pynvml; pynvml.nvmlInit()
        else:
            __import__(step)
    except Exception as e:
        print(step, "failed:", e, flush=True)
    now = tids()
    print(f"{step}: +{len(now - prev)} threads {names(now - prev)[:3]}", flush=True)
    prev = now
import torch
print(f"imports {time.time()-t0:.1f}s, cuda initialized in parent: {torch.cuda.is_initialized()}", flush=True)
for i in range(2):
    ts = time.time()
    pid = os.fork()
    if pid == 0:
        try:
            os.environ.update(CUDA_VISIBLE_DEVICES="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + i), RANK="0",
                              WORLD_SIZE="1", LOCAL_RANK="0")
            import deepspeed
            deepspeed.init_distributed(dist_backend="nccl", verbose=False)
            torch.distributed.all_reduce(torch.ones(4, device="cuda"))
            m = torch.nn.Linear(4096, 4096, device="cuda", dtype=torch.bfloat16)
            opt = torch.optim.AdamW(m.parameters(), fused=True)
            for _ in range(3):
                m(torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)).float().pow(2).mean().backward()
                opt.step(); opt.zero_grad()
            torch.cuda.synchronize()
            print(f"child {i}: CUDA + NCCL + fused AdamW ok, {time.time()-ts:.2f}s after fork", flush=True)
            torch.distributed.destroy_process_group()
            os._exit(0)
        except BaseException as e:
            print(f"child {i}: FAILED {type(e).__name__}: {e}", flush=True)
            os._exit(3)
    _, st = os.waitpid(pid, 0)
    print(f"child {i} exit status {os.waitstatus_to_exitcode(st)}", flush=True)
