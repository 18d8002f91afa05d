"""The full-size plan: your program at its real size, nothing computed (launcher/fullsize.py starts it).

    python -m launcher plan --full-size --script examples/fullsize/tiny.py --nodes 1 --nproc-per-node 2 --gpu h100-96g -- --steps 1 --dim 256 --layers 2

record.py the recorder (a dispatch mode over the fake tensors: allocations, frees, ops, collectives,
phases), trace.py its file, allocator.py the CUDA caching allocator's model, memory.py the replay and
the verdict, speed.py the step time, device.py the constants beside the hardware table, report.py
the table and the JSON.
"""
