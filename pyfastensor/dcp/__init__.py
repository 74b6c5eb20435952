"""torch.distributed.checkpoint (DCP) storage through pyfastensor's engines.

:class:`Writer` and :class:`Reader` are a StorageWriter/StorageReader pair::

    import torch.distributed.checkpoint as dcp
    from pyfastensor.dcp import Writer, Reader

    dcp.save(state_dict, storage_writer=Writer("ckpt"))
    dcp.async_save(state_dict, storage_writer=Writer("ckpt")).result()
    dcp.load(state_dict, storage_reader=Reader("ckpt"))

with or without an initialized process group. Items are raw 4 KiB-aligned records,
one data file per rank (no pickling of tensors); DCP's metadata records each item's
file, offset, length, dtype, shape, CRC-32 and page sums, so a resharded load reads
(and checks) only the pages it needs. Importing this module imports
torch.distributed; ``import pyfastensor`` does not.
"""

from ._format import Record
from ._reader import Reader
from ._writer import Writer

__all__ = ["Reader", "Record", "Writer"]
