"""A mask from outside the package, in one file: each query attends the keys at or after it (a
right-to-left causal mask). Registered on import (LONGCA_PLUGINS=anti_causal_mask), as a user's
own pattern would be."""

import numpy as np

from longca.masks import slices as sl
from longca.masks.pattern import GENERIC_FORMS, MaskPattern, make_mask
from longca.masks.registry import register

PATTERN = register(
    MaskPattern(
        "anti_causal",
        "regular",
        lambda c: make_mask(
            c, "anti_causal", np.array([[0, c.seqlen, 0, c.seqlen, sl.Kind.INVCAUSAL]], dtype=np.int64)
        ),
        GENERIC_FORMS,
        description="k >= q",
    )
)
