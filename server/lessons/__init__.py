"""Lessons as the lab runs them: the preset catalog, the bounds a student may change, the
lesson's policy, predictions, what a crash mode does to a run, a pending (armed) kill,
and the resume checks built from stored records.
"""
