"""``memorywalker view``: a static, offline HTML page per trajectory showing its conditioning tree."""

from memorywalker.viewer.data import message_text, view_data
from memorywalker.viewer.page import page_html, page_name, write_page

__all__ = ["message_text", "page_html", "page_name", "view_data", "write_page"]
