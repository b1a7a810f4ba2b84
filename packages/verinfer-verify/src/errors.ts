/** A check that failed; ``check`` names it (the same names as the Python client's). */
export class VerificationError extends Error {
  constructor(public readonly check: string, message: string, public readonly choice?: number) {
    super(`${check}${choice === undefined ? "" : ` (choice ${choice})`}: ${message}`);
    this.name = "VerificationError";
  }
}
