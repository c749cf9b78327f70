"""The `neuron` process-group backend of the simulated device: gloo underneath.

TorchNeuron registers a c10d backend named `neuron` for the `neuron` device; torchtitan 0.3.0 picks it from
`Backend.default_device_backend_map["neuron"]`. Here the creator returns a Python subclass of c10d's `Backend` (as
TorchNeuron's is a C++ one) whose collectives copy neuron tensors to the host, run gloo's collective there, and copy
the result back. Like TorchNeuron's, it is registered for the `neuron` device only: host tensors (torch's object
collectives, DCP's save planning) need a group of "neuron:neuron,cpu:gloo", which c10d composes around it.
Every collective is recorded (`COLLECTIVES`: name, dtype, element count, reduction).

gloo has no AVG or PREMUL_SUM reduction: AVG is a SUM divided by the group size afterwards, PREMUL_SUM a SUM of
each input scaled by the op's factor first, as NCCL gives them (FSDP2 reduce-scatters gradients with PREMUL_SUM).
Whether TorchNeuron's backend takes PREMUL_SUM is not documented: the census lists each reduction used.
Reduce-scatters are an all-reduce of the whole input and this rank's chunk of it (same numbers, more traffic).
"""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend, _create_work_from_future

NAME = "neuron"
COLLECTIVES: list[tuple[str, str, int, str]] = []


def _record(name: str, tensors, op=None) -> None:
    reduction = "" if op is None else str(op.op if hasattr(op, "op") else op).rsplit(".", 1)[-1]
    for tensor in tensors:
        COLLECTIVES.append((name, str(tensor.dtype).removeprefix("torch."), tensor.numel(), reduction))


def _host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.device.type == "cpu" else tensor.detach().to("cpu")


def _back(host: torch.Tensor, tensor: torch.Tensor) -> None:
    if host is not tensor:
        tensor.copy_(host)


def _done(result=None):
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


class NeuronBackend(Backend):
    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self) -> str:  # noqa: N802  (the C++ name the trampoline calls)
        return NAME

    # ---- helpers ----------------------------------------------------------------------------------------------

    def _allreduce_host(self, hosts: list[torch.Tensor], op) -> None:
        average = op == dist.ReduceOp.AVG
        if op == dist.ReduceOp.PREMUL_SUM:
            for host in hosts:
                host.mul_(op.factor)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.SUM if average or op == dist.ReduceOp.PREMUL_SUM else op
        self._gloo.allreduce(hosts, options).wait()
        if average:
            for host in hosts:
                host.div_(self.size()) if host.is_floating_point() else host.floor_divide_(self.size())

    # ---- collectives ------------------------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        _record("allreduce", tensors, op)
        hosts = [_host(t) for t in tensors]
        self._allreduce_host(hosts, op)
        for host, tensor in zip(hosts, tensors):
            _back(host, tensor)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        _record("allreduce_coalesced", tensors, op)
        hosts = [_host(t) for t in tensors]
        for host in hosts:
            self._allreduce_host([host], op)
        for host, tensor in zip(hosts, tensors):
            _back(host, tensor)
        return _done(tensors)

    def allgather(self, output_lists, inputs, opts=None):
        _record("allgather", inputs)
        out_hosts = [[_host(t) for t in outputs] for outputs in output_lists]
        self._gloo.allgather(out_hosts, [_host(t) for t in inputs]).wait()
        for hosts, outputs in zip(out_hosts, output_lists):
            for host, tensor in zip(hosts, outputs):
                _back(host, tensor)
        return _done(output_lists)

    def all_gather_single(self, output, input, opts=None):
        _record("all_gather_into_tensor", [input])
        host_out = _host(output)
        chunks = list(host_out.chunk(self.size()))
        self._gloo.allgather([chunks], [_host(input)]).wait()
        _back(host_out, output)
        return _done([output])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self.all_gather_single(output, input, opts)
        return _done(outputs)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        for output, inputs in zip(outputs, input_lists):
            _record("reduce_scatter", [output], op)
            whole = torch.stack([_host(t).contiguous() for t in inputs])
            self._allreduce_host([whole], op)
            output.copy_(whole[self.rank()])
        return _done(outputs)

    def reduce_scatter_single(self, output, input, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        _record("reduce_scatter_tensor", [input], op)
        whole = _host(input).clone()
        self._allreduce_host([whole], op)
        output.copy_(whole.chunk(self.size())[self.rank()].view_as(output))
        return _done([output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self.reduce_scatter_single(output, input, opts)
        return _done(outputs)

    def broadcast(self, tensors, opts=None):
        _record("broadcast", tensors)
        hosts = [_host(t) for t in tensors]
        options = dist.BroadcastOptions()
        if opts is not None:
            options.rootRank, options.rootTensor = opts.rootRank, opts.rootTensor
        self._gloo.broadcast(hosts, options).wait()
        for host, tensor in zip(hosts, tensors):
            _back(host, tensor)
        return _done(tensors)

    def reduce(self, tensors, opts=None):
        _record("reduce", tensors)
        hosts = [_host(t) for t in tensors]
        self._allreduce_host(hosts, opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if opts is None or opts.rootRank == self.rank():
            for host, tensor in zip(hosts, tensors):
                _back(host, tensor)
        return _done(tensors)

    def barrier(self, opts=None):
        COLLECTIVES.append(("barrier", "", 0, ""))
        self._gloo.barrier().wait()
        return _done()

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        _record("all_to_all_single", [input])
        host_out = _host(output)
        self._gloo.alltoall_base(
            host_out, _host(input).contiguous(), list(output_split_sizes), list(input_split_sizes)
        ).wait()
        _back(host_out, output)
        return _done([output])

    def alltoall(self, outputs, inputs, opts=None):
        _record("alltoall", inputs)
        whole_in = torch.cat([_host(t).reshape(-1) for t in inputs])
        whole_out = torch.empty(sum(t.numel() for t in outputs), dtype=whole_in.dtype)
        self._gloo.alltoall_base(whole_out, whole_in, [t.numel() for t in outputs], [t.numel() for t in inputs]).wait()
        for piece, output in zip(whole_out.split([t.numel() for t in outputs]), outputs):
            output.copy_(piece.view_as(output))
        return _done(outputs)

    def send(self, tensors, dst: int, tag: int = 0):
        _record("send", tensors)
        self._gloo.send([_host(t).contiguous() for t in tensors], dst, tag).wait()
        return _done(tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        _record("recv", tensors)
        hosts = [torch.empty_like(t, device="cpu") for t in tensors]
        self._gloo.recv(hosts, src, tag).wait()
        for host, tensor in zip(hosts, tensors):
            tensor.copy_(host)
        return _done(tensors)


def create(backend_options, pg_options=None) -> NeuronBackend:
    """The creator `register_backend(..., extended_api=True)` calls with c10d's _DistributedBackendOptions."""
    return NeuronBackend(
        backend_options.store, backend_options.group_rank, backend_options.group_size, backend_options.timeout
    )


def register() -> None:
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, create, extended_api=True, devices=[NAME])
