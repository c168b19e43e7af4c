"""The KV canary record's layout: what a forward found in the KV slots it read for one
batch entry, copied back with the batch's results (the reference engine writes it on
the device, ``overlapcheck/engine/canary.py``; ``events.Canary`` carries it to the
checkers).

Record columns per entry (``CANARY`` wide): read length, mismatching slots, the first
mismatch's slot and position, the (token, position, request) found there, and the
``digest.token_digest`` of every token read; with the KV backup, a decode's check of
the host pool: the span backed up, differing positions, the first one and the tag the
host pool held there; with a draft kind that keeps tagged KV rows, the same check of
those rows (``DK_*``).
"""
from __future__ import annotations

C_LEN, C_BAD, C_SLOT, C_POS, C_TOK, C_KPOS, C_RID, C_DIGEST = range(8)
BK_START, BK_END, BK_BAD, BK_POS, BK_TOK, BK_KPOS, BK_RID = range(8, 15)
# with a draft kind that keeps KV rows with tags (EAGLE's, a standalone draft's), the
# same check of its rows: the columns C_LEN..C_DIGEST of the draft KV, and the shift of
# its tokens (an EAGLE pair at p holds the token at p + 1)
DK_LEN, DK_BAD, DK_SLOT, DK_POS, DK_TOK, DK_KPOS, DK_RID, DK_DIGEST, DK_SHIFT = range(15, 24)
CANARY = 24


def backup_fields(rec) -> tuple:
    """The ``Canary.backup`` fields of a decode record that checked the KV backup."""
    return tuple(rec[BK_START:DK_LEN])


def draft_fields(rec) -> tuple:
    """The ``Canary.draft`` fields of a record that checked the draft KV."""
    return tuple(rec[DK_LEN:DK_SHIFT + 1])


def canary_fields(rec, backup: bool, draft: bool = False) -> tuple:
    """The ``Canary`` fields after (iteration, batch, rid) of a record; ``backup``: the
    record carries the KV backup's check; ``draft``: the draft KV's."""
    n, bad, slot, pos, tok, kpos, rid, digest = rec[:C_DIGEST + 1]
    return (n, bad, slot, pos, (tok, kpos, rid), digest, backup_fields(rec) if backup else (),
            draft_fields(rec) if draft else ())
