"""Measure: reads the machine and what a trial uses of it (NVML, NUMA, env.json, clocks, energy,
processes, the GPUs' view, perf counters), each kind of trial's meters behind one object (`meters`);
the lowest stage, as a rank, the planner, the runner and the report all read the machine."""
