"""The MCP gateway at ``/mcp`` (docs/mcp.md): the tool catalogue as MCP tools over streamable
HTTP, each call a proposal in the caller's task, authenticated by the API's bearer tokens."""
