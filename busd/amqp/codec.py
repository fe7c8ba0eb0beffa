"""The AMQP 1.0 codec as the rest of busd uses it: one import for values and messages.

Each part lives in a module of its own and is re-exported here unchanged:

    busd.amqp.types      the Python types standing for precise AMQP types, and CodecError
    busd.amqp.decoding   decoding and skipping AMQP values
    busd.amqp.encoding   encoding AMQP values
    busd.amqp.sections   section descriptor codes and finding a message's sections
    busd.amqp.incoming   what the broker reads from a sent message, and its stored form (blob)
    busd.amqp.batches    batch envelopes and their inner messages
    busd.amqp.delivery   a stored message as delivered, and application-property patches
    busd.amqp.messages   whole messages decoded and encoded, for $cbs and $management

Callers only ever see `CodecError` for bad bytes or values that cannot be encoded.

busd has its own codec instead of proton's `Message` for fidelity (the bare message is handed
on byte for byte, with the sender's exact AMQP types) and for speed (a sent message is scanned
once for the few fields the broker needs, never decoded and encoded whole): docs/design.md §3.2.
"""

from __future__ import annotations

from busd.amqp import batches, decoding, delivery, encoding, incoming, messages, sections, types
from busd.amqp.batches import *  # noqa: F403
from busd.amqp.decoding import *  # noqa: F403
from busd.amqp.delivery import *  # noqa: F403
from busd.amqp.encoding import *  # noqa: F403
from busd.amqp.incoming import *  # noqa: F403
from busd.amqp.messages import *  # noqa: F403
from busd.amqp.sections import *  # noqa: F403
from busd.amqp.types import *  # noqa: F403

# what each module names in its __all__, and nothing else
__all__ = [
    *types.__all__,
    *decoding.__all__,
    *encoding.__all__,
    *sections.__all__,
    *incoming.__all__,
    *batches.__all__,
    *delivery.__all__,
    *messages.__all__,
]
