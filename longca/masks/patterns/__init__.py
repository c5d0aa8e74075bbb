"""One module per mask pattern, each defining `PATTERN` (longca.masks.pattern.MaskPattern);
longca.masks.registry finds them all."""
