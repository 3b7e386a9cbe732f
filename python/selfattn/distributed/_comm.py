"""The transport, all of it torch.distributed's: point-to-point exchanges round the ring
(batch_isend_irecv), the all-to-all of the Ulysses layout (all_to_all_single), and the check that
every rank of a group called with the same shapes and options (one small all_gather).

The custom ops name their group by its group_name (an op's arguments cannot hold a ProcessGroup) and
find it again with torch.distributed's own resolver, the one its traceable functional collectives
use, so a group passed into a torch.compile'd function resolves at run time too.

gloo sends and all-to-alls host memory only: with gloo, CUDA tensors are staged through the host
(what lets one GPU run several ranks, to test the plumbing; NCCL refuses two ranks on one GPU).

A rank that fails between two exchanges leaves its peers waiting in theirs: they raise when the
process group's timeout (init_process_group(timeout=...), or new_group(timeout=...)) runs out."""
from __future__ import annotations

import torch
import torch.distributed as dist

# Exchanges in flight at once between the same two ranks (K/V ahead, dK/dV behind, in the backward)
# are told apart by their tag, not only by their order.
KV_TAG, GRAD_TAG = 0, 1


def group_name(group) -> str:
    """The name under which the custom ops find `group` (None: the default group) again."""
    from selfattn import InvalidArgument
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgument("group: torch.distributed is not initialized (call torch.distributed."
                              "init_process_group first, or run under torchrun)")
    return (dist.group.WORLD if group is None else group).group_name


def resolve(name: str):
    return dist.distributed_c10d._resolve_process_group(name)


class Shown(str):
    """A value already written out as the agreement check shows it (its repr is itself)."""

    def __repr__(self):
        return str(self)


class Pending:
    """An exchange in flight: wait() gives the received tensor, on the device it is wanted on."""

    def __init__(self, requests, received, device):
        self.requests, self.received, self.device = requests, received, device

    def wait(self):
        for request in self.requests:
            request.wait()
        return self.received.to(self.device)


class Group:
    """One process group seen from this rank: its rank, size and the exchanges between its ranks."""

    def __init__(self, name: str):
        self.group = resolve(name)
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self.host_only = dist.get_backend(self.group) == "gloo"

    def _staged(self, tensor):
        return tensor.cpu() if self.host_only else tensor

    def _global(self, offset):
        return dist.get_global_rank(self.group, (self.rank + offset) % self.size)

    def exchange(self, tensor, send_offset: int, receive_offset: int, tag: int) -> Pending:
        """Sends `tensor` (contiguous) to the rank send_offset places on, and receives a tensor of its
        shape and dtype from the rank receive_offset places on; both are issued now."""
        sent = self._staged(tensor)
        received = torch.empty_like(sent)
        ops = [dist.P2POp(dist.isend, sent, self._global(send_offset), self.group, tag),
               dist.P2POp(dist.irecv, received, self._global(receive_offset), self.group, tag)]
        return Pending(dist.batch_isend_irecv(ops), received, tensor.device)

    def all_to_all(self, tensor):
        """all_to_all_single over the first axis (one slice per rank, in rank order)."""
        sent = self._staged(tensor.contiguous())
        received = torch.empty_like(sent)
        dist.all_to_all_single(received, sent, group=self.group)
        return received.to(tensor.device)

    def check_agreement(self, function: str, items, device):
        """Raises InvalidArgument on every rank when the ranks passed different values: items are
        (name, value) pairs, compared by their repr (cut to 63 bytes), gathered in one all_gather."""
        from selfattn import InvalidArgument
        if self.size == 1:
            return
        width = 64
        table = torch.zeros((len(items), width), dtype=torch.uint8)
        for i, (_, value) in enumerate(items):
            text = repr(value).encode()[:width - 1]
            table[i, :len(text)] = torch.tensor(list(text), dtype=torch.uint8)
        where = "cpu" if self.host_only else device
        gathered = [torch.empty_like(table, device=where) for _ in range(self.size)]
        dist.all_gather(gathered, table.to(where), group=self.group)
        gathered = [g.cpu() for g in gathered]
        for i, (name, _) in enumerate(items):
            values = [bytes(g[i].tolist()).rstrip(b"\0").decode(errors="replace") for g in gathered]
            if len(set(values)) > 1:
                listed = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
                raise InvalidArgument(f"{function}: the ranks of the group disagree on {name} ({listed}); every "
                                      f"rank must pass the same shapes and options")
