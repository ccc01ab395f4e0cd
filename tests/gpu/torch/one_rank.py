# SPDX-License-Identifier: MIT
"""What the one-rank PyTorch checks share: the process group on GPU 0, test
data, and the dump that tests/gpu/nccl_compare.py compares bit for bit."""
import os


class OneRank:
    """A world of one rank on GPU 0 (backend nccl). skipped is set, and the
    reason printed, where torch or the GPU is missing (the caller exits 77)."""

    def __init__(self):
        self.skipped = False
        self.results = []
        try:
            import torch
            import torch.distributed as dist
        except ImportError as e:
            print("no torch (%s): skipped" % e)
            self.skipped = True
            return
        if not torch.cuda.is_available():
            print("no GPU: skipped")
            self.skipped = True
            return
        self.torch, self.dist = torch, dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.cuda.set_device(0)
        self.dev = torch.device("cuda", 0)
        dist.init_process_group("nccl", init_method="env://", rank=0, world_size=1, device_id=self.dev)

    def dump(self, name, t):
        """Keep @t's bytes under @name, once the device is done with it."""
        self.torch.cuda.synchronize()
        self.results.append((name, t.detach().contiguous().cpu().view(self.torch.uint8).numpy().tobytes()))

    def data(self, n, dtype, seed):
        """n elements of dtype, integers in [-1000, 1000) (floating: times 1/8), on the GPU."""
        torch = self.torch
        g = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32)
        if dtype.is_floating_point:
            return (x.to(torch.float32) * 0.125).to(dtype).to(self.dev)
        return x.to(dtype).to(self.dev)

    def finish(self, outfile):
        """End the process group and write every dump to outfile ('NAME bytes=N', the bytes, a newline)."""
        self.dist.barrier()
        self.dist.destroy_process_group()
        with open(outfile, "wb") as fh:
            for name, b in self.results:
                fh.write(("%s bytes=%d\n" % (name, len(b))).encode())
                fh.write(b)
                fh.write(b"\n")
        return len(self.results)
