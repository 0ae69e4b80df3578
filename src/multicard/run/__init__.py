"""Run: the planned trials are run, one process tree each, and recorded one line per attempt
(`runner`, `store`), on one node or many (`cluster`, `node_step`, `preflight`), under locks and
signals that mean something on a cluster (`locks`, `stopping`)."""
