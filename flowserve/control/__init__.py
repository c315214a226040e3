"""Operator control of running workers: a stage worker hosted in a faust app whose agent on the topology's
control topic takes ``pause``, ``resume``, ``stats`` and ``stop`` (:mod:`flowserve.control.faust_host`,
``flowserve worker --host faust``), and :func:`~flowserve.control.faust_host.send_command`
(``flowserve control``). faust is imported only from that module, never with this package.
"""
