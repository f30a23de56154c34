"""SkyHop, a small flight-booking site: a search form with dates and validation errors, results, a booking
form (passenger, e-mail, cabin) with validation, and trips that can be cancelled. Its state
(`/__forge/state`): `today`, `airports`, `flights` (one row per flight and date, with its fare), `cabins`
(fare multipliers), `bookings` (seeded ones first), `requests`.

    python3 travel.py --port 8102 [--data data/travel.json]
"""

from __future__ import annotations

import re
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from webapp import App, Request, Response, esc, main, money  # noqa: E402 - run as a script beside webapp.py

EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[a-z]{2,}", re.IGNORECASE)


def booking_ref(n: int) -> str:
    """A six-character reference, the same for the same booking number on every run."""
    alphabet, out, x = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789", "", 7919 * n + 104729
    for _ in range(6):
        x, r = divmod(x * 31 + 17, len(alphabet))
        out += alphabet[r]
    return out


def build(data: dict) -> App:
    state = {"today": data["today"], "airports": data["airports"], "flights": data["flights"],
             "cabins": data["cabins"], "bookings": data["bookings"], "requests": []}
    app = App("SkyHop", [("Flights", "/"), ("My trips", "/trips")], state)
    airports = state["airports"]

    def flight(number: str, day: str) -> dict | None:
        return next((f for f in state["flights"] if f["flight"] == number and f["date"] == day), None)

    def search_form(values: dict[str, str]) -> str:
        def select(name: str, label: str) -> str:
            options = "".join(f'<option value="{code}"{" selected" if values.get(name) == code else ""}>'
                              f'{esc(city)} ({code})</option>' for code, city in [("", "choose"), *airports.items()])
            return f'<label>{label} <select name="{name}">{options}</select></label>'
        return (f'<form action="/flights" method="get">{select("origin", "From")}{select("destination", "To")}'
                f'<label>Date <input name="date" placeholder="YYYY-MM-DD" value="{esc(values.get("date", ""))}">'
                f'</label><label>Passengers <input name="passengers" size="2" '
                f'value="{esc(values.get("passengers", "1"))}"></label><button type="submit">Search flights</button>'
                f'</form>')

    def search_errors(q: dict[str, str]) -> list[str]:
        errors = [f"{label} is required." for name, label in (("origin", "From"), ("destination", "To"),
                                                               ("date", "Date")) if not q.get(name)]
        if q.get("origin") and q.get("origin") == q.get("destination"):
            errors.append("From and To must be different airports.")
        if q.get("date"):
            try:
                if date.fromisoformat(q["date"]) < date.fromisoformat(state["today"]):
                    errors.append(f"The date must not be before today ({state['today']}).")
            except ValueError:
                errors.append("Date must be written YYYY-MM-DD.")
        if not q.get("passengers", "1").isdigit() or not 1 <= int(q.get("passengers", "1")) <= 6:
            errors.append("Passengers must be a number from 1 to 6.")
        return errors

    @app.route("GET", "/")
    def home(req: Request) -> Response:
        return app.page("Find a flight", f"<p>Today is {state['today']}.</p>{search_form({})}")

    @app.route("GET", "/flights")
    def flights(req: Request) -> Response:
        q = req.query
        errors = search_errors(q)
        if errors:
            shown = "".join(f'<p class="error">{esc(e)}</p>' for e in errors)
            return app.page("Find a flight", f"{shown}{search_form(q)}", 400)
        found = sorted((f for f in state["flights"] if (f["origin"], f["destination"], f["date"]) ==
                        (q["origin"], q["destination"], q["date"])), key=lambda f: f["depart"])
        passengers = q.get("passengers", "1")
        rows = "".join(f'<tr><td>{f["flight"]}</td><td>{f["depart"]}</td><td>{f["arrive"]}</td>'
                       f'<td>{money(f["price"])}</td><td><a href="/book/{f["flight"]}?date={f["date"]}&amp;'
                       f'passengers={esc(passengers)}">Select {f["flight"]}</a></td></tr>' for f in found)
        table = (f"<table><tr><th>Flight</th><th>Departs</th><th>Arrives</th><th>Economy fare</th><th></th></tr>"
                 f"{rows}</table>" if found else "<p>No flights on that day.</p>")
        heading = f"{airports[q['origin']]} to {airports[q['destination']]} on {q['date']}"
        return app.page(heading, f"{search_form(q)}{table}")

    def booking_form(f: dict, passengers: str, values: dict[str, str], errors: list[str]) -> str:
        shown = "".join(f'<p class="error">{esc(e)}</p>' for e in errors)
        inputs = "".join(f'<label>{label} <input name="{name}" value="{esc(values.get(name, ""))}"></label>'
                         for name, label in (("first_name", "First name"), ("last_name", "Last name"),
                                             ("email", "E-mail")))
        chosen = values.get("cabin", "economy")
        radios = "".join(f'<label><input type="radio" name="cabin" value="{c}"{" checked" if c == chosen else ""}> '
                         f'{c} ({money(f["price"] * m)} per passenger)</label>' for c, m in state["cabins"].items())
        return (f'<p>{f["flight"]} {airports[f["origin"]]} {f["depart"]} to {airports[f["destination"]]} '
                f'{f["arrive"]} on {f["date"]}, {esc(passengers)} passenger(s)</p>{shown}'
                f'<form action="/book/{f["flight"]}" method="post"><input type="hidden" name="date" '
                f'value="{f["date"]}"><input type="hidden" name="passengers" value="{esc(passengers)}">{inputs}'
                f'<fieldset><legend>Cabin</legend>{radios}</fieldset><button type="submit">Book now</button></form>')

    @app.route("GET", "/book/{number}")
    def book_page(req: Request, number: str) -> Response:
        f = flight(number, req.query.get("date", ""))
        if f is None:
            return app.page("Not found", "<p>No such flight on that date.</p>", 404)
        return app.page(f"Book {number}", booking_form(f, req.query.get("passengers", "1"), {}, []))

    @app.route("POST", "/book/{number}")
    def book(req: Request, number: str) -> Response:
        form = req.form
        f = flight(number, form.get("date", ""))
        if f is None:
            return app.page("Not found", "<p>No such flight on that date.</p>", 404)
        passengers = form.get("passengers", "1")
        errors = [f"{label} is required." for name, label in (("first_name", "First name"),
                                                               ("last_name", "Last name"), ("email", "E-mail"))
                  if not form.get(name)]
        if form.get("email") and not EMAIL.fullmatch(form["email"]):
            errors.append("Enter a valid e-mail address.")
        if form.get("cabin", "economy") not in state["cabins"]:
            errors.append("Choose a cabin.")
        if not passengers.isdigit() or not 1 <= int(passengers) <= min(6, f["seats"]):
            errors.append("Not enough seats for that many passengers.")
        if errors:
            return app.page(f"Book {number}", booking_form(f, passengers, form, errors), 400)
        cabin = form.get("cabin", "economy")
        booking = {"ref": booking_ref(len(state["bookings"])), "flight": number, "date": f["date"],
                   "first_name": form["first_name"], "last_name": form["last_name"], "email": form["email"],
                   "cabin": cabin, "passengers": int(passengers),
                   "total": round(f["price"] * state["cabins"][cabin] * int(passengers), 2), "status": "confirmed"}
        f["seats"] -= int(passengers)
        state["bookings"].append(booking)
        return Response(location=f"/trips/{booking['ref']}")

    @app.route("GET", "/trips")
    def trips(req: Request) -> Response:
        rows = "".join(f'<tr><td><a href="/trips/{b["ref"]}">{b["ref"]}</a></td><td>{b["flight"]}</td>'
                       f'<td>{b["date"]}</td><td>{b["status"]}</td></tr>' for b in state["bookings"])
        return app.page("My trips", f"<table><tr><th>Reference</th><th>Flight</th><th>Date</th><th>Status</th>"
                                    f"</tr>{rows}</table>")

    @app.route("GET", "/trips/{ref}")
    def trip(req: Request, ref: str) -> Response:
        b = next((b for b in state["bookings"] if b["ref"] == ref), None)
        if b is None:
            return app.page("Not found", "<p>No such booking.</p>", 404)
        f = flight(b["flight"], b["date"])
        cancel = (f'<form action="/trips/{ref}/cancel" method="post"><button type="submit">Cancel booking</button>'
                  f'</form>' if b["status"] == "confirmed" else "")
        return app.page(f"Booking {ref}", f'<p class="ok">Status: {b["status"]}</p><p>Flight {b["flight"]}: '
                                          f'{airports[f["origin"]]} {f["depart"]} to {airports[f["destination"]]} '
                                          f'{f["arrive"]} on {b["date"]}</p><p>Passenger: {esc(b["first_name"])} '
                                          f'{esc(b["last_name"])} ({esc(b["email"])}), {b["passengers"]} seat(s), '
                                          f'{b["cabin"]}</p><p>Total: {money(b["total"])}</p>{cancel}')

    @app.route("POST", "/trips/{ref}/cancel")
    def cancel(req: Request, ref: str) -> Response:
        b = next((b for b in state["bookings"] if b["ref"] == ref), None)
        if b is None or b["status"] != "confirmed":
            return app.page("Cancel", "<p class='error'>This booking cannot be cancelled.</p>", 400)
        b["status"] = "cancelled"
        flight(b["flight"], b["date"])["seats"] += b["passengers"]
        return Response(location=f"/trips/{ref}")

    return app


if __name__ == "__main__":
    main(build, Path(__file__).resolve().parent / "data" / "travel.json")
