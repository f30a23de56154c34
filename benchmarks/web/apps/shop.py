"""Leaf & Kettle, a small shop: search with filters and sorting, product pages, a cart, checkout with
validation, and order history. Its state (`/__forge/state`): `products`, `cart` ({sku: qty}), `orders`
(seeded history first), `requests`.

    python3 shop.py --port 8101 [--data data/shop.json]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from webapp import App, Request, Response, esc, main, money  # noqa: E402 - run as a script beside webapp.py

SORTS = {"relevance": None, "price_asc": ("price", False), "price_desc": ("price", True),
         "rating": ("rating", True)}
CHECKOUT_FIELDS = (("name", "Full name"), ("address", "Street address"), ("city", "City"), ("zip", "ZIP code"))


def build(data: dict) -> App:
    state = {"products": data["products"], "cart": {}, "orders": data["orders"], "requests": [],
             "shipping": data["shipping"], "next_order": data["next_order"]}
    app = App("Leaf & Kettle", [("Home", "/"), ("Search", "/search"), ("Cart", "/cart"), ("Orders", "/orders")],
              state)
    products = {p["sku"]: p for p in state["products"]}
    categories = sorted({p["category"] for p in state["products"]})

    def product_row(p: dict) -> str:
        stock = "In stock" if p["stock"] else "Out of stock"
        return (f'<div class="card"><a href="/product/{esc(p["sku"])}">{esc(p["name"])}</a> '
                f'&middot; {money(p["price"])} &middot; rating {p["rating"]} &middot; {stock}</div>')

    def search_form(q: str = "", category: str = "", max_price: str = "", in_stock: bool = False,
                    sort: str = "relevance") -> str:
        options = "".join(f'<option value="{esc(c)}"{" selected" if c == category else ""}>{esc(c)}</option>'
                          for c in ["", *categories])
        sorts = "".join(f'<option value="{s}"{" selected" if s == sort else ""}>{s}</option>' for s in SORTS)
        return (f'<form action="/search" method="get"><label>Search <input name="q" value="{esc(q)}" '
                f'placeholder="Search products"></label><label>Category <select name="category">{options}'
                f'</select></label><label>Max price <input name="max_price" value="{esc(max_price)}"></label>'
                f'<label><input type="checkbox" name="in_stock" value="1"{" checked" if in_stock else ""}> '
                f'In stock only</label><label>Sort <select name="sort">{sorts}</select></label>'
                f'<button type="submit">Search</button></form>')

    @app.route("GET", "/")
    def home(req: Request) -> Response:
        cats = "".join(f'<li><a href="/search?category={esc(c)}">{esc(c)}</a></li>' for c in categories)
        return app.page("Welcome", f"{search_form()}<h2>Categories</h2><ul>{cats}</ul>")

    @app.route("GET", "/search")
    def search(req: Request) -> Response:
        q, category = req.query.get("q", ""), req.query.get("category", "")
        max_price, in_stock = req.query.get("max_price", ""), req.query.get("in_stock") == "1"
        sort = req.query.get("sort", "relevance") if req.query.get("sort") in SORTS else "relevance"
        found = [p for p in state["products"]
                 if all(w in f'{p["name"]} {p["description"]}'.lower() for w in q.lower().split())
                 and (not category or p["category"] == category) and (not in_stock or p["stock"] > 0)]
        error = ""
        if max_price:
            try:
                found = [p for p in found if p["price"] <= float(max_price.lstrip("$"))]
            except ValueError:
                error = f'<p class="error">Max price must be a number, not "{esc(max_price)}".</p>'
        if SORTS[sort]:
            key, reverse = SORTS[sort]
            found.sort(key=lambda p: p[key], reverse=reverse)
        rows = "".join(product_row(p) for p in found) or "<p>No products match.</p>"
        return app.page("Search", f"{search_form(q, category, max_price, in_stock, sort)}{error}"
                                  f"<p>{len(found)} results</p>{rows}")

    @app.route("GET", "/product/{sku}")
    def product(req: Request, sku: str) -> Response:
        p = products.get(sku)
        if p is None:
            return app.page("Not found", "<p>No such product.</p>", 404)
        buy = (f'<form action="/cart/add" method="post"><input type="hidden" name="sku" value="{esc(sku)}">'
               f'<label>Quantity <input name="qty" value="1" size="3"></label>'
               f'<button type="submit">Add to cart</button></form>' if p["stock"] else
               '<p class="error">Out of stock</p>')
        return app.page(p["name"], f'<p>{esc(p["description"])}</p><p>Price: {money(p["price"])}</p>'
                                   f'<p>Category: {esc(p["category"])}</p><p>Rating: {p["rating"]} / 5</p>'
                                   f'<p>SKU: {esc(sku)}</p><p>{p["stock"]} in stock</p>{buy}')

    @app.route("POST", "/cart/add")
    def cart_add(req: Request) -> Response:
        p = products.get(req.form.get("sku", ""))
        qty = req.form.get("qty", "1")
        if p is None or not qty.isdigit() or not 1 <= int(qty) <= p["stock"] - state["cart"].get(p["sku"], 0):
            return app.page("Cart", '<p class="error">That quantity is not available.</p>', 400)
        state["cart"][p["sku"]] = state["cart"].get(p["sku"], 0) + int(qty)
        return Response(location="/cart")

    @app.route("POST", "/cart/remove")
    def cart_remove(req: Request) -> Response:
        state["cart"].pop(req.form.get("sku", ""), None)
        return Response(location="/cart")

    def cart_lines() -> tuple[list[dict], float]:
        lines = [{"sku": sku, "name": products[sku]["name"], "price": products[sku]["price"], "qty": qty}
                 for sku, qty in state["cart"].items()]
        return lines, round(sum(line["price"] * line["qty"] for line in lines), 2)

    @app.route("GET", "/cart")
    def cart(req: Request) -> Response:
        lines, subtotal = cart_lines()
        if not lines:
            return app.page("Cart", "<p>Your cart is empty.</p>")
        rows = "".join(f'<tr><td>{esc(line["name"])}</td><td>{line["qty"]}</td><td>{money(line["price"])}</td>'
                       f'<td><form class="inline" action="/cart/remove" method="post"><input type="hidden" '
                       f'name="sku" value="{esc(line["sku"])}"><button type="submit">Remove</button></form></td></tr>'
                       for line in lines)
        return app.page("Cart", f"<table><tr><th>Item</th><th>Qty</th><th>Price</th><th></th></tr>{rows}</table>"
                                f"<p>Subtotal: {money(subtotal)}</p><p><a href='/checkout'>Proceed to checkout</a></p>")

    def checkout_form(values: dict[str, str], errors: list[str]) -> str:
        shown = "".join(f'<p class="error">{esc(e)}</p>' for e in errors)
        inputs = "".join(f'<label>{label} <input name="{name}" value="{esc(values.get(name, ""))}"></label>'
                         for name, label in CHECKOUT_FIELDS)
        chosen = values.get("shipping", "standard")
        radios = "".join(f'<label><input type="radio" name="shipping" value="{s}"{" checked" if s == chosen else ""}>'
                         f' {s} ({money(cost)})</label>' for s, cost in state["shipping"].items())
        return (f'{shown}<form action="/checkout" method="post">{inputs}<fieldset><legend>Shipping</legend>{radios}'
                f'</fieldset><button type="submit">Place order</button></form>')

    @app.route("GET", "/checkout")
    def checkout(req: Request) -> Response:
        lines, subtotal = cart_lines()
        if not lines:
            return app.page("Checkout", "<p>Your cart is empty.</p>")
        return app.page("Checkout", f"<p>Subtotal: {money(subtotal)}</p>{checkout_form({}, [])}")

    @app.route("POST", "/checkout")
    def place_order(req: Request) -> Response:
        lines, subtotal = cart_lines()
        errors = [f"{label} is required." for name, label in CHECKOUT_FIELDS if not req.form.get(name)]
        if req.form.get("zip") and not re.fullmatch(r"\d{5}", req.form["zip"]):
            errors.append("ZIP code must be 5 digits.")
        shipping = req.form.get("shipping", "standard")
        if shipping not in state["shipping"]:
            errors.append("Choose a shipping method.")
        if not lines:
            errors.append("Your cart is empty.")
        if errors:
            return app.page("Checkout", checkout_form(req.form, errors), 400)
        cost = state["shipping"][shipping]
        order = {"id": state["next_order"], "date": "2026-12-01", "items": lines, "shipping": shipping,
                 "shipping_cost": cost, "total": round(subtotal + cost, 2), "status": "placed",
                 **{name: req.form[name] for name, _ in CHECKOUT_FIELDS}}
        state["orders"].append(order)
        state["next_order"] += 1
        state["cart"] = {}
        return Response(location=f"/orders/{order['id']}")

    @app.route("GET", "/orders")
    def orders(req: Request) -> Response:
        rows = "".join(f'<tr><td><a href="/orders/{o["id"]}">#{o["id"]}</a></td><td>{o["date"]}</td>'
                       f'<td>{money(o["total"])}</td><td>{o["status"]}</td></tr>' for o in reversed(state["orders"]))
        return app.page("Order history", f"<table><tr><th>Order</th><th>Date</th><th>Total</th><th>Status</th>"
                                         f"</tr>{rows}</table>")

    @app.route("GET", "/orders/{order_id}")
    def order(req: Request, order_id: str) -> Response:
        o = next((o for o in state["orders"] if str(o["id"]) == order_id), None)
        if o is None:
            return app.page("Not found", "<p>No such order.</p>", 404)
        items = "".join(f'<li>{line["qty"]} x {esc(line["name"])} at {money(line["price"])}</li>'
                        for line in o["items"])
        return app.page(f"Order #{o['id']}", f'<p class="ok">Status: {o["status"]}</p><p>Date: {o["date"]}</p>'
                                             f'<ul>{items}</ul><p>Shipping: {o["shipping"]} '
                                             f'({money(o["shipping_cost"])})</p><p>Total: {money(o["total"])}</p>'
                                             f'<p>Ship to: {esc(o["name"])}, {esc(o["address"])}, {esc(o["city"])} '
                                             f'{esc(o["zip"])}</p>')

    return app


if __name__ == "__main__":
    main(build, Path(__file__).resolve().parent / "data" / "shop.json")
