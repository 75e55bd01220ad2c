"""What the PyTorch peers of launch/gpu_check.sh share (attention_torch.py, moe_layer_torch.py,
gpt2_moe_torch.py): their exit statuses, the size lists of their command lines, the run's context
(device, command, date) and the JSON report, whose fields are scmoe-bench's (bench/report.cpp) so that
launch/gpu_report.py reads both alike."""
import datetime
import json
import os
import platform
import shlex
import sys
import time

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


def parse_sizes(parser, text, flag):
    """'1024,4K' -> [1024, 4096] (K = 1024, M = 1024 * 1024, as scmoe-bench's size lists)."""
    sizes = []
    for item in filter(None, text.split(",")):
        scale = 1
        if item[-1] in "kKmM":
            scale, item = (1024 if item[-1] in "kK" else 1024 * 1024), item[:-1]
        try:
            value = int(item) * scale
        except ValueError:
            value = 0
        if value <= 0:
            parser.error(f"{flag} '{text}': expected positive sizes such as 1024 or 4K")
        sizes.append(value)
    if not sizes:
        parser.error(f"{flag}: empty list")
    return sizes


def unavailable(program, message):
    """Exit status 3, 'not available' to gpu_check.sh: torch (or what the peer needs) is missing here."""
    print(f"{program}: {message}", file=sys.stderr)
    sys.exit(EXIT_UNAVAILABLE)


def tflops(flops, us):
    return flops / (us * 1e-6) / 1e12 if us > 0 else 0.0


def time_us(torch, device_type, fn, iters, warmup):
    """Mean microseconds of `fn` over `iters` calls after `warmup` untimed ones: CUDA events around the
    timed loop on a GPU (as scmoe-bench times its streams), the host's clock on the CPU."""
    for _ in range(warmup):
        fn()
    if device_type == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        return 1000.0 * start.elapsed_time(stop) / iters
    begin = time.perf_counter()
    for _ in range(iters):
        fn()
    return 1e6 * (time.perf_counter() - begin) / iters


def run_context(torch, device_type, argv):
    """(device description, command line, UTC date) of this run."""
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        description = f"cuda:{torch.cuda.current_device()} {props.name} (sm_{props.major}{props.minor})"
    else:
        description = f"cpu {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"
    command = " ".join(shlex.quote(x) for x in [sys.argv[0]] + list(argv))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return description, command, date


def write_report(path, benchmark, version, args, context, backend, rows, summary=None, notes=None, **extra):
    """The -J report: `context` is run_context's triple; `extra` adds fields (compare_with, peer_note, wrong)."""
    description, command, date = context
    report = {
        "benchmark": benchmark,
        "version": version,
        "args": args,
        "command": command,
        **extra,
        "device": description,
        "backend": backend,
        "date": date,
        "host": platform.node(),
        "environment": {k: v for k, v in os.environ.items()
                        if k.startswith(("SCMOE_", "TORCH_", "TORCHINDUCTOR_", "CUDNN_"))
                        or k == "CUDA_VISIBLE_DEVICES"},
        "notes": notes or [],
        "rows": rows,
        "summary": summary or {},
    }
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
