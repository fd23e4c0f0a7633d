"""``dsv4kit doctor``: the checks, in order, from the control machine to the serving units."""
