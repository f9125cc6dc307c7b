"""Projects written for other model servers, served as they are: Truss folders and Cortex projects.

Each module turns one foreign project layout into modelserve's `ProjectConfig` and provides the runtime
contracts that layout's user code expects (constructor arguments, hook shapes, helper imports).
"""
