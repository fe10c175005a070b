"""The rule engine: EMQX 5 rule SQL over messages and client events, with actions.

Layers, each its own module (docs/rules.md):

- :mod:`~gateway.rules.parser` (lark grammar) -> :mod:`~gateway.rules.ast` (frozen tree)
- :mod:`~gateway.rules.compiler` (tree -> closures; evaluation semantics) with
  :mod:`~gateway.rules.functions` (EMQX's SQL functions) and
  :mod:`~gateway.rules.events` (event sources and their fields)
- :mod:`~gateway.rules.actions` and :mod:`~gateway.rules.template` (what outputs do)
- :mod:`~gateway.rules.engine` (the hook subscriber), :mod:`~gateway.rules.service`
  (assembly inside gatewayd, persistence), :mod:`~gateway.admin.rules_api` (management API),
  :mod:`~gateway.config.rules` (configuration models)
"""

from gateway.rules.compiler import Program, compile_sql
from gateway.rules.parser import SqlError, parse

__all__ = ["Program", "SqlError", "compile_sql", "parse"]
