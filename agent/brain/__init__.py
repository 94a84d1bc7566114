"""The brain: goals planned into skill calls (the LangGraph graph, the deterministic and LLM
planners), the loop that places, watches and recovers jobs, and the wiring that builds the core
parts from the settings. It knows nothing of the doors a request comes in by."""
