"""pagoda.router: one OpenAI endpoint in front of many ModelServers.

It routes each request by its `model` to a ready replica (LeastLoad or PrefixHash, per ModelServer),
passes responses through as they stream, holds requests for a ModelServer at zero replicas while it
scales up, and exports its own queue per model. It imports neither torch nor the operator's kopf
code: it runs from the runtime image as `pagoda router`.
"""
