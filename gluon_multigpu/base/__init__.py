"""The ground floor: what every other group may use, and nothing above it but file safety.

``engine`` (MXNet's engine settings, set before MXNet loads), ``compat``
(MXNet 1.9.1 made loadable on today's NumPy and Python), ``opcache``
(MXNet's operator cache kept across processes),
``signals`` (the stop signals, the rules of a stop request, a stop raised
where the code is), ``background`` (work on a thread while a block runs),
``units`` (durations and sizes in words), ``protocol`` (the names a launched
job's processes share). None of them loads MXNet.
"""
