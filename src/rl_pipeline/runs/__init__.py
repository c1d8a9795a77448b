"""What keeps a run safe to kill and to repeat: saves written whole or not at all
(:mod:`.staging`, :mod:`.jsonfile`), the leftovers of killed runs swept (:mod:`.debris`),
one run per stage at a time (:mod:`.stage_lock`), and a stage's inputs checked before it
starts (:mod:`.stage_inputs`)."""
