"""Engine cores in processes of their own: the messages between a front-end and an engine core
(protocol), the engine-core side of the socket (server), the front-end side with the batcher's
interface (client), and the process plan from the CPU budget (plan)."""
