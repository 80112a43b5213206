"""Report stage: figures (:mod:`~bayesprism.report.plots`) and the one-file HTML report
(:mod:`~bayesprism.report.html`, :mod:`~bayesprism.report.sections`) of what the other stages
computed.
"""
